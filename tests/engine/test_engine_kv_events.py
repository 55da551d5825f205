"""KV-cache events: what the block manager reports matches the requests' tokens and its own
prefix cache, through real requests on a tiny model: runs of stored blocks chained by their
parents' hashes, evictions, resets; hashes as they go out (``external_block_hash``)."""

from __future__ import annotations

from infernetes.runtime.engine.block_manager import HASH_FUNCTIONS, BlockManager
from infernetes.runtime.engine.request import Request
from infernetes.runtime.kv_events.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventCollector,
    external_block_hash,
)
from infernetes.runtime.llm import LLM
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

BLOCK_SIZE = 8


def _chain(hash_fn, tokens: list[int]) -> dict:
    """Each full block's published hash -> (its parent's, its tokens), as a request without an
    adapter chains them."""
    blocks, parent = {}, None
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = tuple(tokens[start : start + BLOCK_SIZE])
        block_hash = hash_fn(parent, block)
        published_parent = None if parent is None else external_block_hash(parent)
        blocks[external_block_hash(block_hash)] = (published_parent, block)
        parent = block_hash
    return blocks


def _blocks(event: BlockStored) -> list[tuple]:
    """A stored run as (hash, parent hash, tokens) per block."""
    tokens, hashes = event.token_ids, event.block_hashes
    assert len(tokens) == len(hashes) * event.block_size
    parents = [event.parent_block_hash, *hashes[:-1]]
    return [
        (h, p, tuple(tokens[i * event.block_size : (i + 1) * event.block_size]))
        for i, (h, p) in enumerate(zip(hashes, parents, strict=True))
    ]


def test_events_follow_the_prefix_cache_of_real_requests(tiny_llama):
    # 8 blocks of 8 tokens: the last request evicts the earlier ones' cached blocks.
    llm = LLM(
        tiny_llama,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=8,
        max_model_len=64,
        enforce_eager=True,
        seed=0,
    )
    core = llm.llm_engine.engine_core
    manager = core.block_manager
    sink = KVEventCollector()
    manager.event_sink = sink
    hash_fn = HASH_FUNCTIONS[core.config.cache.prefix_caching_hash_algo]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    shared = [5, 17, 33, 2, 8, 41, 9, 12, 60]
    sequences = []
    for suffix in ([70, 71, 72], [80, 81], list(range(100, 145))):
        (output,) = llm.generate([{"prompt_token_ids": shared + suffix}], params)
        sequences.append(list(output.prompt_token_ids) + list(output.outputs[0].token_ids))

    events = sink.take()
    known = {}
    for tokens in sequences:
        known |= _chain(hash_fn, tokens)
    live: set = set()
    stored: set = set()
    for event in events:
        match event:
            case BlockStored():
                assert event.block_size == BLOCK_SIZE and event.lora_id is None
                assert (event.medium, event.group_idx) == ("GPU", None)
                for block_hash, parent, tokens in _blocks(event):
                    assert (parent, tokens) == known[block_hash]
                    assert block_hash not in live
                    live.add(block_hash)
                    stored.add(block_hash)
            case BlockRemoved():
                (block_hash,) = event.block_hashes
                live.remove(block_hash)
    # Every full block whose keys were computed was stored (the last sampled token never is).
    for tokens in sequences:
        assert set(_chain(hash_fn, tokens[:-1])) <= stored
    assert any(isinstance(e, BlockRemoved) for e in events)  # the cache was full: evictions
    assert live == {external_block_hash(h) for h in manager.cached}

    assert core.reset_prefix_cache() is True
    assert sink.take() == [AllBlocksCleared()] and not manager.cached


def test_a_stored_run_names_its_adapter_and_chains_on_the_blocks_before():
    sink = KVEventCollector()
    manager = BlockManager(num_blocks=8, block_size=2, hash_algo="sha256", event_sink=sink)
    lora = LoRARequest("sql", 3, "/adapters/sql")
    request = Request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1), lora_request=lora)
    assert manager.allocate_slots(request, 5)
    (first,) = sink.take()  # the two full blocks stored together, as vLLM's block pool does
    digests = request.block_hashes
    assert first.block_hashes == [int.from_bytes(d, "big") & (2**64 - 1) for d in digests]
    assert (first.token_ids, first.parent_block_hash) == ([1, 2, 3, 4], None)
    assert (first.lora_id, first.lora_name, first.block_size) == (3, "sql", 2)
    # the request grows by a token: its third block is stored on its own, chained on the second
    request.num_computed_tokens = 5
    request.append_token(6)
    assert manager.allocate_slots(request, 1)
    (second,) = sink.take()
    assert (second.token_ids, second.parent_block_hash) == ([5, 6], first.block_hashes[-1])


def test_every_hash_choice_of_the_schema_has_a_hash_function():
    """vLLM 0.33's xxhash and xxhash_cbor run (as builtin), warned about; sha256_cbor is vLLM's."""
    from infernetes.schema.args import get_arg
    from infernetes.schema.config import build_config
    from infernetes.schema.support_check import check_support

    assert set(HASH_FUNCTIONS) == set(get_arg("--prefix-caching-hash-algo").choices)
    for algo in ("xxhash", "xxhash_cbor"):
        report = check_support(build_config("m", prefix_caching_hash_algo=algo), environ={})
        assert report.errors == [] and len(report.warnings) == 1, report
        assert f"--prefix-caching-hash-algo {algo} has no effect here" in report.warnings[0]
    assert check_support(build_config("m", prefix_caching_hash_algo="sha256"), environ={}) == (
        check_support(build_config("m"), environ={})
    )


def test_blocks_with_images_name_their_digests_in_extra_keys():
    from infernetes.runtime.multimodal.inputs import MultiModalFeature

    def request(image: str) -> Request:
        feature = MultiModalFeature("image", 3, 4, image, {})  # positions 3..6
        return Request(
            image, [1, 2, 9, 9, 9, 9, 7, 8, 5], SamplingParams(max_tokens=1), mm_features=[feature]
        )

    for algo in ("sha256", "sha256_cbor"):
        sink = KVEventCollector()
        manager = BlockManager(num_blocks=16, block_size=2, hash_algo=algo, event_sink=sink)
        first, other = request("cat"), request("dog")
        assert manager.allocate_slots(first, 9) and manager.allocate_slots(other, 9)
        stored, _ = sink.take()
        # blocks [2, 4) and [4, 6) hold the image's placeholders, [6, 8) its last one
        assert stored.extra_keys == [None, ("cat",), ("cat",), ("cat",)]
        # the same tokens with another image: the first block is shared, the rest are not
        assert first.block_hashes[0] == other.block_hashes[0]
        assert not set(first.block_hashes[1:]) & set(other.block_hashes[1:])
