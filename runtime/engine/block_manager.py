"""BlockManager: the paged KV cache's blocks, reference counts and the prefix cache.

Blocks hold ``block_size`` tokens. A full block is identified by a hash chained over every token
before it (parent hash + its own tokens), so two requests with the same prefix share the blocks
(reference counts). Blocks whose count drops to zero go to the back of the free queue but keep
their hash: a later request with the same prefix takes them back; allocation takes from the front,
so the least recently freed cached block is evicted first.

With ``sliding_window`` (a model whose every layer attends only to its last N tokens), a request's
blocks that no query of it can reach any more go back as it advances: it holds about a window's
worth of blocks however long it grows.

With an ``event_sink`` it reports what the prefix cache gains and loses (``kv_events/events.py``,
vLLM's events): each run of a request's blocks stored when their hashes start finding them, a
block removed when it is evicted, all cleared on a reset.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from infernetes.runtime.engine.block_hash import block_hash as cbor_block_hash
from infernetes.runtime.engine.block_hash import none_hash
from infernetes.runtime.engine.request import Request
from infernetes.runtime.kv_events.events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventSink,
    external_block_hash,
)
from infernetes.runtime.multimodal.inputs import overlapping

BlockHash = Any


def _builtin_hash(parent: BlockHash | None, tokens: tuple[int, ...]) -> BlockHash:
    return hash((parent, tokens))


def _sha256_hash(parent: BlockHash | None, tokens: tuple[int, ...]) -> BlockHash:
    return hashlib.sha256(pickle.dumps((parent, tokens), protocol=5)).digest()


HASH_FUNCTIONS: dict[str, Callable[[BlockHash | None, tuple[int, ...]], BlockHash]] = {
    "builtin": _builtin_hash,
    "sha256": _sha256_hash,
    # sha256_cbor chains through block_hash.py instead (SHA256_CBOR below); vLLM's xxhash
    # choices hash as builtin (schema/support.py says so when one is given)
    "sha256_cbor": _sha256_hash,
    "xxhash": _builtin_hash,
    "xxhash_cbor": _builtin_hash,
}
# vLLM's portable hash (block_hash.py), chained from its seeded root with the request's extra keys.
SHA256_CBOR = "sha256_cbor"


def _extra_keys(request: Request) -> tuple | None:
    """What a request's blocks' KV depends on beyond their tokens, as vLLM keys it: the adapter's
    name; here also an embeddings prompt's digest (vLLM hashes each block's embeddings instead)."""
    keys: tuple = ()
    if request.lora_request is not None:
        keys += (request.lora_request.lora_name,)
    if request.prompt_embeds_digest is not None:
        keys += (request.prompt_embeds_digest,)
    return keys or None


def _block_extra_keys(request: Request, start: int, end: int) -> tuple | None:
    """The request's extra keys and, as vLLM adds them, the digest of each image whose
    placeholder tokens overlap the block's positions [start, end): the same tokens with another
    image are other KV. Later blocks inherit the difference through their parent hash."""
    images = tuple(overlapping(request.mm_features, start, end))
    if not images:
        return _extra_keys(request)
    return (_extra_keys(request) or ()) + images


class KVBlock:
    __slots__ = ("block_hash", "block_id", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: BlockHash | None = None


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_algo: str = "builtin",
        sliding_window: int | None = None,
        event_sink: KVEventSink | None = None,
        hash_without_caching: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        # a KV connector finds blocks by their hashes even with the prefix cache off
        self.hash_without_caching = hash_without_caching
        self.sliding_window = sliding_window
        self._hash = HASH_FUNCTIONS.get(hash_algo, _sha256_hash)
        self._cbor_root = none_hash() if hash_algo == SHA256_CBOR else None
        # Blocks are made on first use, in id order: a CPU cache of a small model has a million
        # blocks, and making them all would cost seconds at startup. The blocks never used yet
        # (ids ``len(blocks)`` and up) come first in the free order, ahead of every freed block.
        self.blocks: list[KVBlock] = []
        # Freed blocks; insertion order is eviction order (front = least recently freed).
        self.free_queue: OrderedDict[int, None] = OrderedDict()
        self.cached: dict[BlockHash, int] = {}
        self.event_sink = event_sink  # None: no event is built

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue) + self.num_blocks - len(self.blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached-but-free blocks count as free, as in vLLM)."""
        if self.num_blocks == 0:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache --------------------------------------------------------------------------

    def _update_hashes(self, request: Request, num_tokens: int) -> None:
        """Extend ``request.block_hashes`` to cover every full block of its first ``num_tokens``."""
        size = self.block_size
        hashes = request.block_hashes
        while (len(hashes) + 1) * size <= num_tokens:
            i = len(hashes)
            tokens = tuple(request.token_ids[i * size : (i + 1) * size])
            if self._cbor_root is not None:
                parent = hashes[-1] if hashes else self._cbor_root
                extra = _block_extra_keys(request, i * size, (i + 1) * size)
                hashes.append(cbor_block_hash(parent, tokens, extra))
            else:
                parent = hashes[-1] if hashes else request.hash_seed
                images = overlapping(request.mm_features, i * size, (i + 1) * size)
                keyed = (*tokens, *images) if images else tokens  # image digests after the ids
                hashes.append(self._hash(parent, keyed))  # type: ignore[arg-type]

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Blocks already holding a prefix of ``request``; at least one token is left to compute."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        if not self.enable_caching:
            if self.hash_without_caching:
                self._update_hashes(request, max_blocks * self.block_size)
            return []
        self._update_hashes(request, max_blocks * self.block_size)
        hits: list[int] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block_id = self.cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _register_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Make the full blocks among the first ``num_tokens`` findable by later requests."""
        num_full = num_tokens // self.block_size
        if num_full <= request.num_hashed_blocks:
            return
        self._update_hashes(request, num_full * self.block_size)
        run: list[int] = []  # consecutive blocks stored now: one event, as vLLM's block pool
        for i in range(request.num_hashed_blocks, num_full):
            block = self.blocks[request.block_ids[i]]
            block_hash = request.block_hashes[i]
            if block.block_hash is None and block_hash not in self.cached:
                block.block_hash = block_hash
                self.cached[block_hash] = block.block_id
                run.append(i)
            elif run:
                self._report_stored(request, run)
                run = []
        if run:
            self._report_stored(request, run)
        request.num_hashed_blocks = num_full

    def _report_stored(self, request: Request, run: list[int]) -> None:
        if self.event_sink is None:
            return
        size, lora, hashes = self.block_size, request.lora_request, request.block_hashes
        first, end = run[0], run[-1] + 1
        # vLLM's per-block extra keys, sent only for a request with images: their digests
        images = [
            tuple(overlapping(request.mm_features, i * size, (i + 1) * size)) or None for i in run
        ]
        self.event_sink.record(
            BlockStored(
                block_hashes=[external_block_hash(hashes[i]) for i in run],
                parent_block_hash=external_block_hash(hashes[first - 1]) if first else None,
                token_ids=request.token_ids[first * size : end * size],
                block_size=size,
                lora_id=None if lora is None else lora.lora_int_id,
                medium=MEDIUM_GPU,
                lora_name=None if lora is None else lora.lora_name,
                extra_keys=images if request.mm_features else None,
                group_idx=None if self.sliding_window is None else 0,
                kv_cache_spec_kind=None if self.sliding_window is None else "sliding_window",
                kv_cache_spec_sliding_window=self.sliding_window,
            )
        )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while requests hold blocks, as in vLLM."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        if self.event_sink is not None:
            self.event_sink.record(AllBlocksCleared())
        return True

    # -- allocation ----------------------------------------------------------------------------

    def _take_free_block(self) -> KVBlock:
        if len(self.blocks) < self.num_blocks:
            block = KVBlock(len(self.blocks))
            self.blocks.append(block)
            block.ref_count = 1
            return block
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict: its content is about to be overwritten
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
                if self.event_sink is not None:
                    self.event_sink.record(
                        BlockRemoved([external_block_hash(block.block_hash)], MEDIUM_GPU)
                    )
            block.block_hash = None
        block.ref_count = 1
        return block

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        cached_blocks: Sequence[int] = (),
        *,
        findable: bool = True,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Give ``request`` room for ``num_new_tokens`` more tokens after its computed ones, and
        slots for ``num_lookahead_tokens`` after those (where a draft model writes the keys and
        values of its guesses; they hold no known token, so no hash).

        ``cached_blocks`` (only for a request that holds no blocks yet) are prefix-cache hits it
        takes over; ``request.num_computed_tokens`` then starts after them. Returns False and
        changes nothing when there are not enough free blocks. ``findable=False``: the new full
        blocks join the prefix cache later (their keys and values are still on their way).
        """
        reused_free = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        num_computed = request.num_computed_tokens + len(cached_blocks) * self.block_size
        held = len(request.block_ids) + len(cached_blocks)
        needed = self.blocks_needed(num_computed + num_new_tokens + num_lookahead_tokens) - held
        if needed > self.num_free_blocks - reused_free:
            return False
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            request.block_ids.append(block_id)
        if cached_blocks:
            request.num_computed_tokens = num_computed
            request.num_hashed_blocks = len(request.block_ids)
        for _ in range(max(needed, 0)):
            request.block_ids.append(self._take_free_block().block_id)
        # Known tokens only: under async scheduling the last may be a sample not seen yet.
        known = min(num_computed + num_new_tokens, request.num_tokens)
        if self.enable_caching and findable:
            self._register_full_blocks(request, known)
        elif self.hash_without_caching:
            self._update_hashes(request, known // self.block_size * self.block_size)
        if self.sliding_window is not None:
            # (async scheduling: its computed count may run ahead of its real first query, by
            # the drafts in flight it does not keep; it is at its last known token at most)
            self._release_out_of_window(request, min(num_computed, request.num_tokens - 1))
        return True

    def _release_out_of_window(self, request: Request, first_query: int) -> None:
        """Give back the blocks wholly before the window of position ``first_query``, the
        earliest query of this step and of every step after it (a query at p reaches p - N + 1
        at the furthest; one token more is kept for models that count the window from p - N)."""
        reachable_from = first_query - self.sliding_window  # type: ignore[operator]
        releasable = max(0, reachable_from // self.block_size)
        for i in range(request.num_released_blocks, min(releasable, len(request.block_ids))):
            self._unref(request.block_ids[i])
            request.num_released_blocks = i + 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue[block_id] = None

    def free(self, request: Request) -> None:
        """Release the request's blocks; tail blocks go first in the queue so they are evicted first."""
        for block_id in reversed(request.block_ids[request.num_released_blocks :]):
            self._unref(block_id)
        request.block_ids = []
        request.num_hashed_blocks = 0
        request.num_released_blocks = 0
