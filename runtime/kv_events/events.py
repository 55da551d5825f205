"""KV-cache events: what the prefix cache gained and lost, as vLLM's msgspec structs
(``vllm/distributed/kv_events.py``), so the events the ``BlockManager`` builds are the ones put on
the wire.

The wire shape is the one llm-d's KV-cache indexer decodes (its ``kvevents`` pool; vLLM's
releases sent it): a batch is an array ``[ts, events, data_parallel_rank]``, each event an array
whose first element names it (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) followed
by its fields in vLLM's order (``wire_batch``). llm-d decodes an event's fields into a struct of
a fixed length, so what follows the tag must be exactly the fields it knows (``FIELDS_SENT``);
a later field goes out, with the ones before it, only when it is set: ``BlockStored`` sends
``lora_name`` only with an adapter and ``group_idx`` and the cache spec only for a sliding-window
model. Block hashes go
out as vLLM sends them by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``): an unsigned 64-bit
integer, the low 64 bits of the engine's hash (``external_block_hash``), which is what llm-d's
KV-cache indexer keys on.

The ``BlockManager`` reports to one ``KVEventSink``; without one (the default) it builds no event
at all. ``KVEventCollector`` keeps the events until they are taken, once per step.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

# Where the blocks live; vLLM's block pool names its own cache so on every device.
MEDIUM_GPU = "GPU"
_LOW_64_BITS = (1 << 64) - 1


def external_block_hash(block_hash: Any) -> int:
    """The engine's block hash as it goes out: its low 64 bits, unsigned (a sha256 digest read
    big-endian, as vLLM does; a builtin hash is a signed 64-bit int)."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & _LOW_64_BITS
    return block_hash & _LOW_64_BITS


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One step's events, sent as one message."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the events; ``tag=True`` with ``array_like`` writes the class name first."""


class BlockStored(KVCacheEvent):
    """Consecutive full blocks of one request became findable in the prefix cache."""

    block_hashes: list[int]
    parent_block_hash: int | None  # the block before the first; None for a request's first
    token_ids: list[int]  # block_size tokens per block, in order
    block_size: int
    lora_id: int | None  # the adapter its request ran with (its hashes are chained on it)
    medium: str | None
    lora_name: str | None = None
    # per block, the digests of the images it covers (None: none); sent for requests with images
    extra_keys: list[Any] | None = None
    group_idx: int | None = None  # the one KV-cache group here: 0, sent with a sliding window
    kv_cache_spec_kind: str | None = None  # "sliding_window", else not sent
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted: their hashes no longer find them."""

    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None  # not sent


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was reset: no hash finds a block any more."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]


# The fields llm-d's indexer (github.com/llm-d/llm-d-kv-cache-manager v0.4.0, its kvevents
# pool) decodes after an event's tag; it refuses an event with more or fewer. (Its successor,
# github.com/llm-d/llm-d-kv-cache, decodes BlockStored with lora_name too: 7.)
FIELDS_SENT = {"BlockStored": 6, "BlockRemoved": 2, "AllBlocksCleared": 0}


def wire_event(event: KVEvent) -> list[Any]:
    """An event as it goes out: its name, then its fields in order, those past ``FIELDS_SENT``
    only up to the last one set."""
    name = type(event).__name__
    values = list(msgspec.structs.astuple(event))
    while len(values) > FIELDS_SENT[name] and values[-1] is None:
        values.pop()
    return [name, *values]


def wire_batch(batch: EventBatch) -> tuple[float, list[list[Any]], int | None]:
    return (batch.ts, [wire_event(event) for event in batch.events], batch.data_parallel_rank)


class KVEventSink(Protocol):
    def record(self, event: KVEvent) -> None: ...


class KVEventCollector:
    """A sink that keeps the events in order until ``take()``."""

    def __init__(self) -> None:
        self._events: list[KVEvent] = []

    def record(self, event: KVEvent) -> None:
        self._events.append(event)

    def take(self) -> list[KVEvent]:
        taken, self._events = self._events, []
        return taken
