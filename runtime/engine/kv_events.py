"""KV-cache events: what the prefix cache gained and lost, in the shape of vLLM's KV events
(``vllm/distributed/kv_events.py``), for whoever tracks which blocks an engine holds (a KV-aware
router, later the ``--kv-events-config`` publisher).

The ``BlockManager`` reports to one ``KVEventSink``; without one (the default) it builds no event
at all. ``KVEventCollector`` keeps the events until they are taken, e.g. once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class BlockStored:
    """A full block became findable in the prefix cache."""

    block_hash: Any
    parent_block_hash: Any  # the previous block's hash; None for a request's first block
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None  # the adapter its request ran with (its hash is chained on it)


@dataclass(frozen=True)
class BlockRemoved:
    """A cached block was evicted: its hash no longer finds it."""

    block_hash: Any


@dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was reset: no hash finds a block any more."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventSink(Protocol):
    def record(self, event: KVCacheEvent) -> None: ...


class KVEventCollector:
    """A sink that keeps the events in order until ``take()``."""

    def __init__(self) -> None:
        self._events: list[KVCacheEvent] = []

    def record(self, event: KVCacheEvent) -> None:
        self._events.append(event)

    def take(self) -> list[KVCacheEvent]:
        taken, self._events = self._events, []
        return taken
