"""OffloadingConnector: a host-memory KV tier below the device's cache, vLLM's connector of that
name (``--kv-offloading-size`` or ``--kv-transfer-config '{"kv_connector": "OffloadingConnector",
...}'``).

Scheduler side (``HostTierIndex``): each step, the full blocks a scheduled request completes are
given host slots (the least recently used blocks evicted for them) and copied there; a request
whose prefix misses the device's prefix cache asks the tier for the blocks after the hit, and
those it holds are loaded back into the request's new blocks while it waits in
``WAITING_FOR_REMOTE_KVS``, instead of being computed again.

Worker side (``HostKVPool``): a step's stores start at the beginning of the next step, after the
forward that wrote them (vLLM defers them so, keeping them off the sampling path); its loads start
before its forward (they fill blocks of requests not in it) and are waited for after it, so each
load is reported done in the step that began it. A stored block becomes findable once the workers
report its request done: a finished request keeps its blocks until its stores are done, and a
preempted one's stores finish before the forward that may reuse its blocks (a flush).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from infernetes.runtime.engine.stats import KVTransfer
from infernetes.runtime.kv_events.events import KVEventCollector
from infernetes.runtime.kv_transfer.base import (
    KVCaches,
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)
from infernetes.runtime.kv_transfer.config import offloading_settings
from infernetes.runtime.kv_transfer.host_pool import CopyJob, HostKVPool
from infernetes.runtime.kv_transfer.host_tier import BlockHash, HostTierIndex
from infernetes.runtime.model_executor.sliding_window import window_of_every_layer

if TYPE_CHECKING:
    from infernetes.runtime.config import RuntimeConfig
    from infernetes.runtime.engine.request import Request
    from infernetes.runtime.engine.scheduler_output import SchedulerOutput
    from infernetes.runtime.kv_events.events import KVEvent
    from infernetes.runtime.model_executor.context import AttentionMetadata

logger = logging.getLogger(__name__)

# (device blocks, host slots) of one request's copies, in step
Transfer = tuple[list[int], list[int]]
# vLLM's transfer_type labels: a store goes device to host, a load back (on every device)
STORE, LOAD = "GPU_to_CPU", "CPU_to_GPU"


@dataclass
class OffloadStep(KVConnectorMetadata):
    """What the workers copy for one step: loads (host -> device) to start now, stores (device ->
    host) of the blocks this step completes, and the requests preempted since the last step."""

    loads: dict[str, Transfer] = field(default_factory=dict)
    stores: dict[str, Transfer] = field(default_factory=dict)
    flush: set[str] = field(default_factory=set)


class OffloadingConnector(KVConnectorBase):
    def __init__(
        self, config: RuntimeConfig, role: KVConnectorRole, rank_block_bytes: int = 0
    ) -> None:
        super().__init__(config, role, rank_block_bytes)
        assert config.kv_transfer is not None
        self.block_size = block_size = config.cache.block_size
        settings = offloading_settings(
            dict(config.kv_transfer.kv_connector_extra_config), block_size
        )
        parallel = config.parallel
        self.world_size = world_size = (
            parallel.tensor_parallel_size * parallel.pipeline_parallel_size
        )
        self.num_host_blocks = settings.num_blocks(rank_block_bytes, world_size)
        if self.num_host_blocks <= 0:
            raise ValueError(
                "the OffloadingConnector's host tier holds no block: cpu_bytes_to_use "
                f"({settings.cpu_bytes_to_use} bytes, --kv-offloading-size in GiB) is less than "
                f"one block ({rank_block_bytes} bytes on each of {world_size} ranks)"
            )
        # -- scheduler side
        events = config.kv_events
        self._events = KVEventCollector() if events is not None and events.publishes else None
        self.tier = HostTierIndex(self.num_host_blocks, block_size, self._events)
        self._requests: dict[str, Request] = {}
        self._next_stored_block: dict[str, int] = {}  # per request: the first not yet stored
        self._loads: dict[str, Transfer] = {}  # planned since the last step
        self._being_stored: defaultdict[str, set[BlockHash]] = defaultdict(set)
        self._being_loaded: dict[str, list[BlockHash]] = {}
        # -- worker side
        self.pool: HostKVPool | None = None
        # A sliding window's blocks go back while their request runs, maybe before their store.
        self._blocks_leave_early = window_of_every_layer(config.model.info.hf_config) is not None
        self._unsubmitted_stores: dict[str, Transfer] = {}  # the last step's, started next step
        self._store_jobs: defaultdict[str, list[CopyJob]] = defaultdict(list)
        self._load_jobs: dict[str, CopyJob] = {}
        self._storing_requests: set[str] = set()  # had stores and not yet reported finished
        self._ended: set[str] = set()  # of those, the ones that ended
        self._transfers: list[KVTransfer] = []  # copies done, not yet reported

    # -- scheduler side ------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.sampling_params
        if params is not None and params.prompt_logprobs is not None:
            return 0, False  # its prompt's logprobs come from computing it
        size = self.block_size
        # at least one token is left to compute (its logits give the first output token)
        last_block = min((request.num_tokens - 1) // size, len(request.block_hashes))
        first_block = num_computed_tokens // size
        if first_block >= last_block:
            return 0, False
        wanted = request.block_hashes[first_block:last_block]
        self.tier.touch(wanted)
        hits = self.tier.lookup(wanted)
        if not hits:
            return 0, False
        return (first_block + hits) * size - num_computed_tokens, True

    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_external_tokens: int
    ) -> None:
        request_id = request.request_id
        self._requests[request_id] = request
        self._next_stored_block.setdefault(request_id, 0)
        if not num_external_tokens:
            return
        first = request.num_computed_tokens // self.block_size
        end = first + num_external_tokens // self.block_size
        hashes = request.block_hashes[first:end]
        self._loads[request_id] = (block_ids[first:end], self.tier.prepare_load(hashes))
        self._being_loaded[request_id] = hashes
        self._next_stored_block[request_id] = max(self._next_stored_block[request_id], end)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> OffloadStep:
        step = OffloadStep(self._loads, self._plan_stores(scheduler_output))
        self._loads = {}
        # the workers finish a preempted request's stores before this step's forward
        for request_id in scheduler_output.preempted_req_ids:
            hashes = self._being_stored.get(request_id)
            if hashes:
                step.flush.add(request_id)
                self.tier.complete_store(hashes)
                hashes.clear()
        return step

    def _plan_stores(self, scheduler_output: SchedulerOutput) -> dict[str, Transfer]:
        """Host slots for the full blocks each scheduled request holds after this step."""
        stores: dict[str, Transfer] = {}
        for data, num_new in zip(
            scheduler_output.scheduled_reqs, scheduler_output.num_scheduled_tokens, strict=True
        ):
            request = self._requests.get(data.request_id)
            if request is None:
                continue
            # known tokens only: under async scheduling the last may be a sample not seen yet
            num_cached = min(data.num_computed_tokens + num_new, request.num_tokens)
            end = min(num_cached // self.block_size, len(request.block_hashes))
            first = self._next_stored_block[request.request_id]
            if end <= first:
                continue
            hashes = request.block_hashes[first:end]
            placed = self.tier.prepare_store(hashes)
            if placed is None:
                logger.debug("host KV tier full: %d blocks not offloaded", end - first)
                continue
            self._next_stored_block[request.request_id] = end
            if placed:
                blocks = [request.block_ids[first + i] for i, _ in placed]
                stores[request.request_id] = (blocks, [slot for _, slot in placed])
                self._being_stored[request.request_id].update(hashes[i] for i, _ in placed)
        return stores

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for request_id in output.finished_sending:
            self.tier.complete_store(self._being_stored.pop(request_id, ()))
        for request_id in output.finished_recving:
            self.tier.complete_load(self._being_loaded.pop(request_id, ()))

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Its blocks stay until the workers report its stores done."""
        self._requests.pop(request.request_id, None)
        self._next_stored_block.pop(request.request_id, None)
        return request.request_id in self._being_stored, None

    def take_events(self) -> list[KVEvent]:
        return [] if self._events is None else self._events.take()

    # -- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        self.pool = HostKVPool(kv_caches, self.num_host_blocks)
        logger.info(
            "KV offloading: a host tier of %d blocks (%.2f GiB on this rank)",
            self.num_host_blocks,
            self.num_host_blocks * self.pool.bytes_per_block / (1 << 30),
        )

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        assert isinstance(metadata, OffloadStep) and self.pool is not None
        for request_id, (blocks, slots) in self._unsubmitted_stores.items():
            self._store_jobs[request_id].append(self.pool.store(blocks, slots))
        self._unsubmitted_stores = dict(metadata.stores)  # started with the next step
        self._storing_requests.update(metadata.stores)
        if metadata.flush or self._blocks_leave_early:
            self.pool.fence()  # the forward may write the blocks of a preempted request
        for request_id, (blocks, slots) in metadata.loads.items():
            self._load_jobs[request_id] = self.pool.load(slots, blocks)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: the blocks loading belong to requests not in this step."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> None:
        """Nothing yet: a step's blocks are stored whole, at the next step's start."""

    def wait_for_save(self) -> None:
        """Nothing to wait for: the stores start with the next step."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Loads end with their step; a request that ended reports its stores done once they
        are (waited for here, so every rank reports it in the same step)."""
        for job in self._load_jobs.values():
            job.wait()
        self._record(LOAD, self._load_jobs.values())
        received = set(self._load_jobs)
        self._load_jobs = {}
        self._ended |= finished_req_ids & self._storing_requests
        # (an ended request's last stores may start only with the next step)
        sent = self._ended - set(self._unsubmitted_stores)
        for request_id, jobs in list(self._store_jobs.items()):
            if request_id in sent:
                for job in jobs:
                    job.wait()
            done = [job for job in jobs if job.done()]
            self._record(STORE, done)
            self._store_jobs[request_id] = [job for job in jobs if job not in done]
            if not self._store_jobs[request_id]:
                del self._store_jobs[request_id]
        self._ended -= sent
        self._storing_requests -= sent
        return sent, received

    def _record(self, transfer_type: str, jobs: Iterable[CopyJob]) -> None:
        assert self.pool is not None
        block_bytes = self.pool.bytes_per_block * self.world_size  # every rank's shard
        for job in jobs:
            self._transfers.append(
                KVTransfer(transfer_type, job.num_blocks * block_bytes, job.seconds)
            )

    def get_kv_connector_stats(self) -> list[KVTransfer]:
        taken, self._transfers = self._transfers, []
        return taken
