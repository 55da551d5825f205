"""NixlConnector: disaggregated prefill with vLLM's protocol (``--kv-transfer-config
'{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'``), the KV moved by NIXL.

A prefill engine (``kv_producer`` or ``kv_both``) given a request whose ``kv_transfer_params``
say ``do_remote_decode`` answers it as usual (the proxy asks for one token) and, when it ends by
length, keeps its blocks and answers with the parameters a decode engine needs to pull them:
``do_remote_prefill``, ``remote_engine_id``, ``remote_request_id``, ``remote_block_ids``,
``remote_host``, ``remote_port`` and ``tp_size``. A decode engine (``kv_consumer`` or
``kv_both``) given those parameters reads the blocks of every prompt token but the last past its
own prefix-cache hit (the last is computed, its logits give the first token) while the request
waits in ``WAITING_FOR_REMOTE_KVS``, then continues. A read that fails (the producer gone, its
blocks timed out, a layout that does not match) leaves the request to compute its prompt here.

Each tensor-parallel rank reads its own shard from the producer's rank of the same number
(``nixl_peer.py``); the ranks agree on which reads failed, so all of them compute the same.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from infernetes.runtime.engine.request import RequestStatus
from infernetes.runtime.engine.stats import NIXL_NOTIFY, NIXL_READ, KVTransfer
from infernetes.runtime.kv_transfer.base import (
    KVCaches,
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorRole,
)
from infernetes.runtime.kv_transfer.nixl_peer import NixlPeer, PendingRead, RemoteSource
from infernetes.runtime.model_executor import parallel

from infernetes.schema.env import read_env

if TYPE_CHECKING:
    from infernetes.runtime.config import RuntimeConfig
    from infernetes.runtime.engine.request import Request
    from infernetes.runtime.engine.scheduler_output import SchedulerOutput
    from infernetes.runtime.model_executor.context import AttentionMetadata

logger = logging.getLogger(__name__)

_PRODUCERS = ("kv_producer", "kv_both")
_CONSUMERS = ("kv_consumer", "kv_both")


@dataclass(frozen=True)
class PlannedRead:
    """Blocks of one request to pull: none, to tell the producer it may free them."""

    source: RemoteSource
    remote_block_ids: list[int]
    local_block_ids: list[int]


@dataclass
class NixlStep(KVConnectorMetadata):
    """Reads to do this step (a decode engine), and requests whose blocks now wait to be pulled
    (a prefill engine)."""

    reads: dict[str, PlannedRead] = field(default_factory=dict)
    holds: list[str] = field(default_factory=list)


def remote_source(params: dict[str, Any]) -> RemoteSource:
    """A producer's parameters read; a missing or mistyped one raises, naming it."""
    try:
        return RemoteSource(
            host=str(params["remote_host"]),
            port=int(params["remote_port"]),
            engine_id=str(params["remote_engine_id"]),
            request_id=str(params["remote_request_id"]),
            tp_size=int(params.get("tp_size", 1)),
        )
    except KeyError as exc:
        raise ValueError(f"kv_transfer_params.{exc.args[0]} is required") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"kv_transfer_params: {exc}") from None


def _remote_block_ids(params: dict[str, Any]) -> list[int]:
    block_ids = params.get("remote_block_ids")
    if not isinstance(block_ids, list) or not all(isinstance(b, int) and b >= 0 for b in block_ids):
        raise ValueError("kv_transfer_params.remote_block_ids must be a list of block ids")
    return block_ids


class NixlConnector(KVConnectorBase):
    def __init__(
        self, config: RuntimeConfig, role: KVConnectorRole, rank_block_bytes: int = 0
    ) -> None:
        super().__init__(config, role, rank_block_bytes)
        assert config.kv_transfer is not None
        transfer = config.kv_transfer
        self.engine_id = transfer.engine_id
        self.kv_role = transfer.kv_role
        self.block_size = config.cache.block_size
        self.tp_size = config.parallel.tensor_parallel_size
        self.host = str(read_env("VLLM_NIXL_SIDE_CHANNEL_HOST"))
        self.port = int(read_env("VLLM_NIXL_SIDE_CHANNEL_PORT"))
        self.timeout_s = float(read_env("VLLM_NIXL_ABORT_REQUEST_TIMEOUT"))
        self.backends = list(transfer.kv_connector_extra_config.get("backends", ["UCX"]))
        # -- scheduler side
        self._reads: dict[str, PlannedRead] = {}
        self._holds: list[str] = []
        self._sending: set[str] = set()  # held for a reader, not yet reported freed
        # -- worker side
        self.peer: NixlPeer | None = None
        self._started: dict[str, PendingRead] = {}  # this step's reads in flight
        self._failed: set[str] = set()  # this step's reads that failed
        self._transfers: list[KVTransfer] = []  # reads and failures since the last report

    # -- scheduler side ------------------------------------------------------------------------

    def _wants_remote_prefill(self, request: Request) -> bool:
        params = request.kv_transfer_params
        return (
            self.kv_role in _CONSUMERS
            and params is not None
            and bool(params.get("do_remote_prefill"))
        )

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if not self._wants_remote_prefill(request):
            return 0, False
        params = request.kv_transfer_params
        assert params is not None
        try:
            remote_source(params)
            num_remote = len(_remote_block_ids(params)) * self.block_size
        except ValueError as exc:
            logger.warning("request %s computes its prompt: %s", request.request_id, exc)
            params["do_remote_prefill"] = False
            return 0, False
        sampling = request.sampling_params
        if sampling is not None and sampling.prompt_logprobs is not None:
            return 0, False  # its prompt's logprobs come from computing it
        # the last prompt token is computed here: its logits give the first output token
        count = min(request.num_prompt_tokens - 1, num_remote) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_external_tokens: int
    ) -> None:
        if not self._wants_remote_prefill(request):
            return
        params = request.kv_transfer_params
        assert params is not None
        params["do_remote_prefill"] = False  # one transfer per request
        first = request.num_computed_tokens // self.block_size
        end = -(-(request.num_computed_tokens + num_external_tokens) // self.block_size)
        remote_ids = _remote_block_ids(params)
        self._reads[request.request_id] = PlannedRead(
            remote_source(params), remote_ids[first:end], block_ids[first:end]
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> NixlStep:
        step = NixlStep(self._reads, self._holds)
        self._reads, self._holds = {}, []
        return step

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        # a notification or a timeout may name a request freed already
        output.finished_sending &= self._sending
        self._sending -= output.finished_sending

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        if not params:
            return False, None
        if self._wants_remote_prefill(request):
            # ended before its read: the producer may free the blocks now
            params["do_remote_prefill"] = False
            with contextlib.suppress(ValueError):  # (bad parameters name no one to tell)
                self._reads[request.request_id] = PlannedRead(remote_source(params), [], [])
            return False, None
        if (
            self.kv_role not in _PRODUCERS
            or not params.get("do_remote_decode")
            or request.status != RequestStatus.FINISHED_LENGTH
            or not block_ids
        ):
            return False, None
        self._holds.append(request.request_id)
        self._sending.add(request.request_id)
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(block_ids),
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": self.tp_size,
        }

    # -- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        if self.peer is None:
            self.peer = NixlPeer(
                self.engine_id,
                parallel.tp_rank(),
                self.tp_size,
                self.block_size,
                (self.host, self.port),
                self.timeout_s,
                self.backends,
            )
        self.peer.register(kv_caches)

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        assert isinstance(metadata, NixlStep) and self.peer is not None
        self.peer.held.hold(metadata.holds)
        for request_id, read in metadata.reads.items():
            if not read.local_block_ids:
                self._notify(read.source)
                continue
            try:
                self._started[request_id] = self.peer.start_read(
                    read.source, read.remote_block_ids, read.local_block_ids
                )
            except Exception as exc:  # any failure: the prompt is computed here
                self._fail(request_id, read.source, exc)

    def _notify(self, source: RemoteSource) -> None:
        assert self.peer is not None
        try:
            self.peer.notify(source)
        except Exception as exc:  # its blocks time out there instead
            logger.warning("could not tell %s to free its blocks: %s", source.engine_id, exc)
            self._transfers.append(KVTransfer(NIXL_NOTIFY, 0, 0.0, failed=True))

    def _fail(self, request_id: str, source: RemoteSource, exc: BaseException) -> None:
        logger.warning(
            "request %s: reading its KV blocks from %s failed (%s); its prompt is computed here",
            request_id,
            source.engine_id,
            exc,
        )
        self._failed.add(request_id)
        self._transfers.append(KVTransfer(NIXL_READ, 0, 0.0, failed=True))
        if not isinstance(exc, LookupError):  # the producer answered: it is there
            assert self.peer is not None
            self.peer.forget(source.engine_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: the blocks being read belong to requests not in this step."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> None:
        """Nothing: the blocks are read from where the forward wrote them."""

    def wait_for_save(self) -> None:
        """Nothing: a reader reads the cache itself."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Reads end with the step that started them (waited for here, so every rank reports
        them in the same step); the ranks agree on the failures."""
        assert self.peer is not None
        received = set()
        for request_id, read in self._started.items():
            try:
                seconds = self.peer.wait(read)
                received.add(request_id)
                self._transfers.append(
                    KVTransfer(
                        NIXL_READ,
                        read.num_bytes * self.tp_size,  # every rank reads its shard
                        seconds,
                        read.post_seconds,
                        read.num_descriptors,
                    )
                )
            except Exception as exc:  # the prompt is computed here
                logger.warning("request %s: the KV read failed (%s)", request_id, exc)
                self._failed.add(request_id)
                self._transfers.append(KVTransfer(NIXL_READ, 0, 0.0, failed=True))
        self._started = {}
        self._failed = _agree_on_failures(received | self._failed, self._failed)
        received -= self._failed
        return self.peer.take_sent(), received

    def get_failed_recving(self) -> set[str]:
        failed, self._failed = self._failed, set()
        return failed

    def get_kv_connector_stats(self) -> list[KVTransfer]:
        """The reads done or failed, and the notifications that failed, since the last call
        (vLLM's vllm:nixl_* metrics)."""
        taken, self._transfers = self._transfers, []
        return taken


def _agree_on_failures(request_ids: set[str], failed: set[str]) -> set[str]:
    """The reads that failed on any tensor-parallel rank (every rank read the same requests)."""
    if parallel.tp_size() == 1 or not request_ids:
        return failed
    ordered = sorted(request_ids)
    flags = torch.tensor([float(r in failed) for r in ordered])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=parallel.state().tp_group)
    return {r for r, flag in zip(ordered, flags.tolist(), strict=True) if flag}
