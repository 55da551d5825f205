"""HostTierIndex: the scheduler's map of the host-memory KV tier (vLLM's ``CPUOffloadingManager``
with its LRU policy): which block hashes the tier holds, in which slot, and which slot goes next.

A block stored in the tier is pending until the workers report its copy done, and only then found
by ``lookup``; a block being loaded back is pinned (counted) so no store evicts it under the copy.
Eviction takes the least recently used block that is ready and unpinned; ``touch`` (a lookup or a
store that finds it) makes a block the most recently used.

With an ``event_sink`` it reports the tier's moves as vLLM's connector does: ``BlockStored`` when a
stored block becomes findable, ``BlockRemoved`` when one is evicted, both with medium ``CPU``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from infernetes.runtime.kv_events.events import (
    BlockRemoved,
    BlockStored,
    KVEventSink,
    external_block_hash,
)

# The tier's medium in KV events (vLLM's CPULoadStoreSpec.medium()).
MEDIUM_CPU = "CPU"

BlockHash = Any


@dataclass
class _HostBlock:
    slot: int
    ready: bool = False  # its copy into the tier is done
    pins: int = 0  # loads reading it now


class HostTierIndex:
    def __init__(
        self, num_blocks: int, block_size: int, event_sink: KVEventSink | None = None
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.event_sink = event_sink
        # insertion order is recency: the front is the least recently used
        self.blocks: OrderedDict[BlockHash, _HostBlock] = OrderedDict()
        self._free_slots = list(range(num_blocks - 1, -1, -1))  # popped from the end: 0 first

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        """How many of ``block_hashes``, from the first, the tier holds ready to load."""
        hits = 0
        for block_hash in block_hashes:
            block = self.blocks.get(block_hash)
            if block is None or not block.ready:
                break
            hits += 1
        return hits

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Make the held ones among ``block_hashes`` the most recently used, the first most (a
        prefix outlives its continuations)."""
        for block_hash in reversed(block_hashes):
            if block_hash in self.blocks:
                self.blocks.move_to_end(block_hash)

    def prepare_store(self, block_hashes: Sequence[BlockHash]) -> list[tuple[int, int]] | None:
        """Slots for those of ``block_hashes`` the tier does not hold yet, as (index in
        ``block_hashes``, slot), evicting least recently used blocks for them; None (and nothing
        changed) when too few blocks can be evicted."""
        wanted = list(dict.fromkeys(h for h in block_hashes if h not in self.blocks))
        shortfall = len(wanted) - len(self._free_slots)
        victims: list[BlockHash] = []
        if shortfall > 0:
            keep = set(block_hashes)  # (those held already are part of this store)
            for block_hash, block in self.blocks.items():
                if len(victims) == shortfall:
                    break
                if block.ready and not block.pins and block_hash not in keep:
                    victims.append(block_hash)
            if len(victims) < shortfall:
                return None
        for block_hash in victims:
            self._free_slots.append(self.blocks.pop(block_hash).slot)
        if victims and self.event_sink is not None:
            self.event_sink.record(
                BlockRemoved([external_block_hash(h) for h in victims], MEDIUM_CPU)
            )
        slots: dict[BlockHash, int] = {}
        for block_hash in wanted:
            slots[block_hash] = self._free_slots.pop()
            self.blocks[block_hash] = _HostBlock(slots[block_hash])
        self.touch(block_hashes)
        placed: list[tuple[int, int]] = []
        for i, block_hash in enumerate(block_hashes):
            if block_hash in slots:
                placed.append((i, slots.pop(block_hash)))
        return placed

    def complete_store(self, block_hashes: Iterable[BlockHash]) -> None:
        """The copies of ``block_hashes`` into the tier are done: lookups find them."""
        stored = []
        for block_hash in block_hashes:
            block = self.blocks.get(block_hash)
            if block is not None and not block.ready:
                block.ready = True
                stored.append(block_hash)
        if stored and self.event_sink is not None:
            self.event_sink.record(
                BlockStored(
                    block_hashes=[external_block_hash(h) for h in stored],
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=self.block_size,
                    lora_id=None,
                    medium=MEDIUM_CPU,
                )
            )

    def prepare_load(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """The slots of ``block_hashes`` (found by ``lookup``), pinned until ``complete_load``."""
        slots = []
        for block_hash in block_hashes:
            block = self.blocks[block_hash]
            block.pins += 1
            slots.append(block.slot)
        return slots

    def complete_load(self, block_hashes: Iterable[BlockHash]) -> None:
        for block_hash in block_hashes:
            self.blocks[block_hash].pins -= 1
