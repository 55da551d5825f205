"""NixlPeer: one worker rank's end of a disaggregated prefill, over NIXL (``nixl`` on PyPI).

The rank registers its KV cache with a NIXL agent (host memory, "DRAM": a CPU engine's cache)
and answers on a side channel (a ZMQ ROUTER socket at ``VLLM_NIXL_SIDE_CHANNEL_HOST``, port
``VLLM_NIXL_SIDE_CHANNEL_PORT`` + its tensor-parallel rank, as vLLM's connector listens):

- ``layout``: its agent's metadata and where each block of each layer's cache lies, which a
  decode rank needs before it can read them (vLLM's handshake);
- ``claim``: whether a finished request's blocks are still held; a claimed request is not freed
  by the timeout while the reader reads (it is freed when the read's notification comes, or one
  more timeout later), so a reader never takes blocks the producer has given back.

A decode rank reads the blocks straight from the producer's cache into its own (a NIXL READ,
which notifies the producer with the request's id when it is done); the producer frees a held
request's blocks on that notification or once ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` passes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import zmq
from infernetes.runtime.kv_transfer.base import KVCaches

logger = logging.getLogger(__name__)

# How long a claim waits for the producer's worker to learn of a request that just finished
# (it learns with the next step, which may come after the response reached the decode side).
CLAIM_WAIT_S = 2.0
# How long a side-channel question waits for its answer: a producer that is gone is a failure.
SIDE_CHANNEL_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class CacheLayout:
    """Where one rank's blocks lie: each region (a layer's keys or values) starts at an address
    and holds ``num_blocks`` blocks of ``block_bytes[region]`` bytes."""

    engine_id: str
    tp_size: int
    block_size: int
    num_blocks: int
    region_addrs: list[int]
    block_bytes: list[int]

    def descriptors(self) -> list[tuple[int, int, int]]:
        """(address, bytes, device 0) of every block of every region, region by region."""
        return [
            (addr + block * size, size, 0)
            for addr, size in zip(self.region_addrs, self.block_bytes, strict=True)
            for block in range(self.num_blocks)
        ]

    def indices(self, block_ids: list[int]) -> list[int]:
        """The descriptors of ``block_ids`` in every region, in ``descriptors()``'s order."""
        return [
            region * self.num_blocks + block
            for region in range(len(self.region_addrs))
            for block in block_ids
        ]


@dataclass(frozen=True)
class PendingRead:
    """A read started: its NIXL handle, when it was posted (``perf_counter``), how long posting
    took, and this rank's bytes and descriptors (vLLM's NIXL transfer metrics)."""

    transfer: Any
    started: float
    post_seconds: float
    num_bytes: int
    num_descriptors: int


@dataclass(frozen=True)
class RemoteSource:
    """Where a request's prefilled blocks wait: the producer's side channel and names."""

    host: str
    port: int
    engine_id: str
    request_id: str
    tp_size: int


class HeldRequests:
    """The producer's finished requests whose blocks wait to be pulled, with their deadlines.
    Shared by the side channel's thread (claims) and the worker (holds, notifications)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._deadlines: dict[str, float] = {}
        self._done: set[str] = set()
        self._changed = threading.Condition()

    def hold(self, request_ids: list[str]) -> None:
        with self._changed:
            for request_id in request_ids:
                self._deadlines[request_id] = time.monotonic() + self.timeout_s
            self._changed.notify_all()

    def claim(self, request_id: str) -> bool:
        """Whether ``request_id``'s blocks are held (waiting a little for a hold on its way);
        a claim gives the reader one more timeout."""
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._deadlines, CLAIM_WAIT_S)
            if request_id not in self._deadlines:
                return False
            self._deadlines[request_id] = time.monotonic() + self.timeout_s
            return True

    def release(self, request_ids: list[str]) -> None:
        """The readers' notifications: these requests' blocks were read."""
        with self._changed:
            for request_id in request_ids:
                if self._deadlines.pop(request_id, None) is not None:
                    self._done.add(request_id)

    def take_done(self) -> set[str]:
        """The requests read or timed out since the last call: their blocks may be freed."""
        now = time.monotonic()
        with self._changed:
            expired = [r for r, deadline in self._deadlines.items() if deadline <= now]
            for request_id in expired:
                del self._deadlines[request_id]
                logger.warning(
                    "KV blocks of request %s were not pulled within "
                    "VLLM_NIXL_ABORT_REQUEST_TIMEOUT (%ss): freed",
                    request_id,
                    self.timeout_s,
                )
            done, self._done = self._done | set(expired), set()
            return done


class SideChannel:
    """The ROUTER socket a producer rank answers ``layout`` and ``claim`` on, in a thread."""

    def __init__(self, host: str, port: int, layout: CacheLayout, agent_metadata: bytes, held):
        self._answers = (json.dumps(asdict(layout)).encode(), agent_metadata)
        self._held = held
        self._stop = threading.Event()
        context: zmq.Context = zmq.Context.instance()
        self._socket = context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVTIMEO, 200)
        self._socket.bind(f"tcp://{_bind_host(host)}:{port}")
        self._thread = threading.Thread(target=self._serve, name="nixl-side-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                identity, _, message = self._socket.recv_multipart()
            except zmq.Again:
                continue
            try:
                question = json.loads(message)
                if question.get("op") == "layout":
                    reply = list(self._answers)
                else:
                    held = self._held.claim(str(question.get("request_id")))
                    reply = [json.dumps({"held": held}).encode()]
            except (ValueError, AttributeError) as exc:
                reply = [json.dumps({"error": str(exc)}).encode()]
            self._socket.send_multipart([identity, b"", *reply])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def _bind_host(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def ask(host: str, port: int, question: dict[str, Any]) -> list[bytes]:
    """One question to a side channel; a producer that does not answer in time is an error."""
    context: zmq.Context = zmq.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, SIDE_CHANNEL_TIMEOUT_MS)
    try:
        socket.connect(f"tcp://{_bind_host(host)}:{port}")
        socket.send(json.dumps(question).encode())
        return socket.recv_multipart()
    except zmq.Again:
        raise ConnectionError(f"the KV producer at {host}:{port} did not answer") from None
    finally:
        socket.close()


@dataclass
class _Remote:
    agent_name: str
    layout: CacheLayout
    handle: Any  # NIXL's prepared descriptor list of its blocks


class NixlPeer:
    """One rank's NIXL agent over its registered KV cache: reads from producers, holds for
    readers."""

    def __init__(
        self,
        engine_id: str,
        tp_rank: int,
        tp_size: int,
        block_size: int,
        side_channel: tuple[str, int],
        timeout_s: float,
        backends: list[str],
    ) -> None:
        from nixl._api import (  # type: ignore[import-untyped]  # (the package has no stubs)
            nixl_agent,
            nixl_agent_config,
        )

        self.engine_id = engine_id
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.block_size = block_size
        self.host, self.port = side_channel
        self.timeout_s = timeout_s
        self.agent = nixl_agent(f"{engine_id}/{tp_rank}", nixl_agent_config(backends=backends))
        self.held = HeldRequests(timeout_s)
        self.layout: CacheLayout | None = None
        self._local_handle: Any = None
        self._registered: Any = None
        self._remotes: dict[str, _Remote] = {}
        self._side_channel: SideChannel | None = None

    def register(self, kv_caches: KVCaches) -> None:
        """Register every layer's caches (once each: a latent layer's keys are its values)."""
        regions: list[torch.Tensor] = []
        for keys, values in kv_caches.values():
            regions += [keys] if values is keys else [keys, values]
        num_blocks = regions[0].shape[0]
        self.layout = CacheLayout(
            self.engine_id,
            self.tp_size,
            self.block_size,
            num_blocks,
            [t.data_ptr() for t in regions],
            [t[0].numel() * t.element_size() for t in regions],
        )
        if self._registered is not None:  # a cache allocated again
            self.agent.deregister_memory(self._registered)
        self._registered = self.agent.register_memory(regions)
        self._local_handle = self.agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", self.layout.descriptors(), "DRAM"
        )
        if self._side_channel is not None:
            self._side_channel.close()
        self._side_channel = SideChannel(
            self.host,
            self.port + self.tp_rank,
            self.layout,
            self.agent.get_agent_metadata(),
            self.held,
        )

    # -- the reading side ----------------------------------------------------------------------

    def start_read(
        self, source: RemoteSource, remote_block_ids: list[int], local_block_ids: list[int]
    ) -> PendingRead:
        """Claim the request's blocks and start reading them into ``local_block_ids``; the
        returned read is waited for with ``wait``. Raises when it cannot be done."""
        remote = self._remote(source)
        port = source.port + self.tp_rank
        (answer,) = ask(source.host, port, {"op": "claim", "request_id": source.request_id})
        if not json.loads(answer).get("held"):
            raise LookupError(
                f"the KV producer {source.engine_id} no longer holds request "
                f"{source.request_id}'s blocks (VLLM_NIXL_ABORT_REQUEST_TIMEOUT passed)"
            )
        if max(remote_block_ids, default=-1) >= remote.layout.num_blocks:
            raise ValueError(f"remote_block_ids past the producer's {remote.layout.num_blocks}")
        assert self.layout is not None
        local = self.layout.indices(local_block_ids)
        started = time.perf_counter()
        transfer = self.agent.make_prepped_xfer(
            "READ",
            self._local_handle,
            local,
            remote.handle,
            remote.layout.indices(remote_block_ids),
            source.request_id.encode(),
        )
        if self.agent.transfer(transfer) == "ERR":
            raise ConnectionError(f"NIXL could not start reading from {source.engine_id}")
        num_bytes = sum(self.layout.block_bytes[index // self.layout.num_blocks] for index in local)
        return PendingRead(transfer, started, time.perf_counter() - started, num_bytes, len(local))

    def wait(self, read: PendingRead) -> float:
        """Until the read is done, its seconds from the start; an error or ``timeout_s`` without
        an end raises."""
        deadline = time.monotonic() + self.timeout_s
        try:
            while (state := self.agent.check_xfer_state(read.transfer)) == "PROC":
                if time.monotonic() > deadline:
                    raise TimeoutError("the KV read did not finish in time")
                time.sleep(0.0005)
            if state != "DONE":
                raise ConnectionError(f"the KV read ended in state {state}")
            return time.perf_counter() - read.started
        finally:
            self.agent.release_xfer_handle(read.transfer)

    def notify(self, source: RemoteSource) -> None:
        """Tell the producer its blocks are not needed (nothing to read: a local hit)."""
        remote = self._remote(source)
        self.agent.send_notif(remote.agent_name, source.request_id.encode())

    def _remote(self, source: RemoteSource) -> _Remote:
        """The producer's agent and layout, asked once per engine (vLLM's handshake)."""
        remote = self._remotes.get(source.engine_id)
        if remote is not None:
            return remote
        header, metadata = ask(source.host, source.port + self.tp_rank, {"op": "layout"})
        layout = CacheLayout(**json.loads(header))
        assert self.layout is not None
        mismatch = [
            name
            for name in ("tp_size", "block_size", "block_bytes")
            if getattr(layout, name) != getattr(self.layout, name)
        ]
        if layout.engine_id != source.engine_id or mismatch:
            raise ValueError(
                f"the KV producer at {source.host}:{source.port} ({layout.engine_id}) does not "
                f"match this engine: {', '.join(mismatch) or 'remote_engine_id'} differ"
            )
        agent_name = self.agent.add_remote_agent(metadata)
        handle = self.agent.prep_xfer_dlist(agent_name, layout.descriptors(), "DRAM")
        remote = self._remotes[source.engine_id] = _Remote(agent_name, layout, handle)
        return remote

    def forget(self, engine_id: str) -> None:
        """Drop a producer that failed (it may come back as a new process)."""
        remote = self._remotes.pop(engine_id, None)
        if remote is not None:
            self.agent.remove_remote_agent(remote.agent_name)

    # -- the holding side ----------------------------------------------------------------------

    def take_sent(self) -> set[str]:
        """Requests whose blocks were read (notified) or timed out: to be freed."""
        notes = self.agent.get_new_notifs()
        self.held.release([note.decode() for messages in notes.values() for note in messages])
        return self.held.take_done()

    def close(self) -> None:
        if self._side_channel is not None:
            self._side_channel.close()
            self._side_channel = None
