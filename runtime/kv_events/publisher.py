"""The ZMQ publisher of KV-cache events, vLLM's ``ZmqEventPublisher`` on the wire.

Each step's events go out as one message on a PUB socket: ``(topic, sequence as 8 bytes
big-endian, msgpack(EventBatch))``, the sequence counting the batches sent from 0. The last
``buffer_steps`` batches are kept for a ROUTER replay socket: a client sends the first sequence
it missed (8 bytes big-endian) and gets each kept batch from there as ``(sequence, payload)``,
then ``(-1, b"")``.

Publishing never holds up a step: the engine only puts the batch on a bounded queue that a
thread of its own encodes and sends from (a PUB socket itself never blocks: past ``hwm`` it drops
for a slow subscriber). When the queue is full the batch is dropped and its events counted
(``take_dropped``, the ``vllm:kv_events_dropped`` metric); vLLM's publisher would block the step
instead.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgspec
import zmq
from infernetes.runtime.config import KVEventsConfig
from infernetes.runtime.kv_events.config import rank_endpoint
from infernetes.runtime.kv_events.events import KVEvent, KVEventBatch

logger = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.1  # how long the thread waits for a batch before it looks at replay requests again


def binds(endpoint: str) -> bool:
    """vLLM's rule: an endpoint with a wildcard host, or a local transport, is bound (the engine
    is the stable side); any other is connected to (a collector listens there)."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


class ZmqEventPublisher:
    """A ``KVEventSink``: the events recorded during a step go out as one batch at ``flush()``.
    Sockets are made here, so a bad or busy endpoint fails the engine's start; after that only
    the publisher thread touches them."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.data_parallel_rank = data_parallel_rank
        self.endpoint = rank_endpoint(config.endpoint, data_parallel_rank)
        self.replay_endpoint = rank_endpoint(config.replay_endpoint, data_parallel_rank)
        self._topic = config.topic.encode()
        self._pending: list[KVEvent] = []
        self._dropped = 0  # events, counted on the engine's thread only
        self._queue: queue.Queue[KVEventBatch] = queue.Queue(maxsize=config.max_queue_size)
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        context: zmq.Context = zmq.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.Socket | None = None
        try:
            assert self.endpoint is not None
            if binds(self.endpoint):
                self._pub.bind(self.endpoint)
            else:
                self._pub.connect(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = context.socket(zmq.ROUTER)
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(f"kv_events_config: cannot open {self.endpoint}: {exc}") from exc
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()
        logger.info("Publishing KV-cache events on %s", self.endpoint)

    # -- the engine's side ---------------------------------------------------------------------

    def record(self, event: KVEvent) -> None:
        self._pending.append(event)

    def flush(self) -> None:
        """Hand the events recorded since the last flush to the thread, as one batch."""
        if not self._pending:
            return
        events, self._pending = self._pending, []
        batch = KVEventBatch(time.time(), events, self.data_parallel_rank)
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._dropped += len(events)

    def take_dropped(self) -> int:
        """Events dropped on a full queue since the last call."""
        dropped, self._dropped = self._dropped, 0
        return dropped

    def shutdown(self) -> None:
        """Send what is queued (for up to a second), then close the sockets."""
        self._stopping.set()
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():  # a socket must not be closed under the thread using it
            self._close_sockets()

    # -- the publisher thread ------------------------------------------------------------------

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        sequence = 0
        while not (self._stopping.is_set() and self._queue.empty()):
            if self._replay is not None:
                while self._replay.poll(0):
                    self._serve_replay()
            try:
                batch = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            payload = encoder.encode(batch)
            try:
                self._pub.send_multipart((self._topic, sequence.to_bytes(8, "big"), payload))
            except zmq.ZMQError:
                logger.exception("KV-cache event batch %d was not sent", sequence)
            self._kept.append((sequence, payload))
            sequence += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:  # [client, empty delimiter, first sequence]
            logger.warning("KV-cache event replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for sequence, payload in list(self._kept):
            if sequence >= first:
                self._replay.send_multipart((client, b"", sequence.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_OF_REPLAY, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


# vLLM's built-in publishers (the support table names the same: a test keeps them equal)
PUBLISHERS = ("null", "zmq")


def create_publisher(
    config: KVEventsConfig | None, data_parallel_rank: int = 0
) -> ZmqEventPublisher | None:
    """The engine core's publisher; None where no events are published (vLLM's null
    publisher)."""
    if config is None:
        return None
    if config.publisher not in PUBLISHERS:
        raise ValueError(f"Unknown event publisher {config.publisher!r}")
    if not config.publishes:
        return None
    return ZmqEventPublisher(config, data_parallel_rank)
