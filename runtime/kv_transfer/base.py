"""The KV connector interface, vLLM V1's (``kv_connector/v1/base.py``): one class, built twice,
once for the scheduler (in the engine core) and once per worker, each using its own half.

Scheduler side, called by the ``Scheduler``:

- ``get_num_new_matched_tokens(request, num_computed_tokens)`` when a waiting request is about to
  get its blocks: how many of its tokens past the computed ones (prefix-cache hits) the connector
  can bring, and whether they arrive later (an async load: the request waits, holding its blocks,
  in ``WAITING_FOR_REMOTE_KVS`` until a worker reports it received). Those tokens count as
  computed; at least one token must be left to compute.
- ``update_state_after_alloc(request, block_ids, num_external_tokens)`` once the blocks are held.
- ``build_connector_meta(scheduler_output)`` for every step: what the workers' connectors need
  to know of it; it travels in ``SchedulerOutput.kv_connector_metadata``.
- ``update_connector_output(output)`` with what the workers reported finished, and
  ``take_events()``: the connector's own KV events, published each step.
- ``request_finished(request, block_ids)`` when a request ends: whether its blocks must stay
  (they are being sent; freed when a worker reports it done sending), and the parameters another
  engine needs to fetch them (kept on ``Request.kv_transfer_params``).

Worker side, called by the ``ModelRunner`` around each step (each call only with a connector):
``register_kv_caches`` once the cache is allocated; ``start_load_kv(metadata)`` before the
forward; per attention layer ``wait_for_layer_load`` before the layer reads its cache and
``save_kv_layer`` after it wrote it (``layers/attention.py``, through the step's
``AttentionMetadata.kv_connector``); ``wait_for_save()`` after the forward; and
``get_finished(finished_req_ids)``, the requests done sending and done receiving (and
``get_failed_recving()``, those whose load failed), which go back
in ``ModelRunnerOutput.kv_connector_output`` with ``get_kv_connector_stats()``, the copies done. Under several ranks only the output rank's report
reaches the scheduler.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from infernetes.runtime.engine.stats import KVTransfer

if TYPE_CHECKING:
    from infernetes.runtime.config import RuntimeConfig
    from infernetes.runtime.engine.request import Request
    from infernetes.runtime.engine.scheduler_output import SchedulerOutput
    from infernetes.runtime.kv_events.events import KVEvent
    from infernetes.runtime.model_executor.context import AttentionMetadata

# Each attention layer's caches by its module name: (keys, values); a latent-attention layer's
# one tensor is both.
KVCaches = Mapping[str, tuple[torch.Tensor, torch.Tensor]]


class KVConnectorRole(enum.Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"


class KVConnectorMetadata:
    """What the scheduler side tells the worker side about one step (a connector subclasses it
    with its own fields)."""


@dataclass
class KVConnectorOutput:
    """What the workers' connectors report after a step, by request id."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    # requests whose load failed: their tokens are computed instead (vLLM's load errors)
    failed_recving: set[str] = field(default_factory=set)
    transfers: list[KVTransfer] = field(default_factory=list)  # copies finished (vLLM's stats)


class KVConnectorBase(abc.ABC):
    def __init__(
        self, config: RuntimeConfig, role: KVConnectorRole, rank_block_bytes: int = 0
    ) -> None:
        """``rank_block_bytes``: what one block of the device's cache takes on one rank (the
        largest over the ranks, on the scheduler side)."""
        self.config = config
        self.role = role

    # -- scheduler side ------------------------------------------------------------------------

    @abc.abstractmethod
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """(tokens it brings past ``num_computed_tokens``, whether they arrive asynchronously)."""

    @abc.abstractmethod
    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_external_tokens: int
    ) -> None:
        """``request`` holds ``block_ids`` (all of its blocks), ``num_external_tokens`` of whose
        tokens the connector brings."""

    @abc.abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """What the workers' connectors need to know of this step."""

    def update_connector_output(self, output: KVConnectorOutput) -> None:  # noqa: B027  # optional
        """What the workers reported finished this step, before the scheduler acts on it."""

    def take_events(self) -> list[KVEvent]:
        """KV events of the connector's own tiers since the last call (published with the
        prefix cache's)."""
        return []

    @abc.abstractmethod
    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """(keep the blocks until a worker reports them sent, parameters for the fetching side)."""

    # -- worker side ---------------------------------------------------------------------------

    @abc.abstractmethod
    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        """The worker's caches, after each allocation (again after waking up)."""

    @abc.abstractmethod
    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        """Before the forward: start bringing this step's external tokens into their blocks."""

    @abc.abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        """Before ``layer_name`` reads its cache: its part of the load is done."""

    @abc.abstractmethod
    def save_kv_layer(
        self, layer_name: str, kv_layer: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> None:
        """After ``layer_name`` wrote this step's keys and values (``meta.slot_mapping`` says
        where): start saving what should leave."""

    @abc.abstractmethod
    def wait_for_save(self) -> None:
        """After the forward: every save of this step is done (the cache may be overwritten)."""

    def get_failed_recving(self) -> set[str]:
        """Requests whose load failed since the last call (after ``get_finished``): not
        received, their tokens are to be computed."""
        return set()

    def get_kv_connector_stats(self) -> list[KVTransfer]:
        """The copies finished since the last call (for the transfer metrics)."""
        return []

    @abc.abstractmethod
    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """(requests done sending, requests done receiving); ``finished_req_ids`` are those that
        ended since the last step."""
