"""The OffloadingConnector (``runtime/kv_transfer/offloading.py``): a host-memory KV tier below a
device cache too small for the working set. Repeated, the working set comes back from the tier
(prompt tokens counted by source, as vLLM's ``vllm:prompt_tokens_by_source``) with the very
tokens of an engine without it, under preemption, concurrent requests, chunked prefill, tensor
parallelism and with the prefix cache off; the tier evicts least recently used blocks; a request
whose blocks are still being stored keeps them until they are; bad settings are refused by name."""

from __future__ import annotations

import random

import pytest
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.kv_events.events import KVEventCollector
from infernetes.runtime.kv_transfer.config import kv_transfer_config
from infernetes.runtime.kv_transfer.host_tier import MEDIUM_CPU, HostTierIndex
from infernetes.runtime.kv_transfer.offloading import LOAD, STORE
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing import StepTotals

from infernetes.schema.config import build_config

BLOCK_SIZE = 16
PROMPT_LEN = 100  # six full blocks, and four tokens to compute
NUM_PROMPTS = 4  # 28 blocks of working set for a device cache of 16
MAX_TOKENS = 6
_rng = random.Random(0)
PROMPTS = [[_rng.randrange(5, 500) for _ in range(PROMPT_LEN)] for _ in range(NUM_PROMPTS)]
FULL_BLOCKS = PROMPT_LEN // BLOCK_SIZE


def offloading(num_cpu_blocks: int = 64) -> dict:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"num_cpu_blocks": num_cpu_blocks},
    }


def _engine(model: str, counter: StepTotals | None = None, **overrides) -> LLMEngine:
    settings = {
        "device": "cpu",
        # float32: in bfloat16 a prefix computed in other chunks than before may flip a token
        "dtype": "float32",
        "max_model_len": 256,
        "num_gpu_blocks_override": 16,
        "seed": 0,
        **overrides,
    }
    return LLMEngine(build_config(model, **settings), stat_loggers=[counter] if counter else [])


def _generate(engine: LLMEngine, prompts, params, start: int = 0) -> dict[str, list[int]]:
    """Every prompt at once (queued together, so they compete for the cache)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(start + i), prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = output.outputs[0].token_ids
    return results


def _one_at_a_time(engine: LLMEngine, rounds: int = 2) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens = []
    for r in range(rounds):
        for i, prompt in enumerate(PROMPTS):
            tokens.extend(_generate(engine, [prompt], params, start=100 * r + i).values())
    return tokens


def test_a_repeated_working_set_larger_than_the_cache_comes_back_from_the_host_tier(tiny_llama):
    wanted = _one_at_a_time(_engine(tiny_llama))
    counter = StepTotals()
    engine = _engine(tiny_llama, counter, kv_transfer_config=offloading())
    assert _one_at_a_time(engine, rounds=1) == wanted[:NUM_PROMPTS]
    # the first round computed every prompt token; the device cache kept none of it for later
    assert counter.tokens_by_source == {
        "local_compute": NUM_PROMPTS * PROMPT_LEN,
        "local_cache_hit": 0,
        "external_kv_transfer": 0,
    }
    block_bytes = engine.engine_core.executor.kv_cache_block_bytes()
    stored = NUM_PROMPTS * FULL_BLOCKS * block_bytes  # each prompt's full blocks, once
    assert counter.copied_bytes == {STORE: stored}
    assert _one_at_a_time(engine, rounds=1) == wanted[NUM_PROMPTS:]
    # the second round loaded every full prompt block back and computed only the rest
    loaded = NUM_PROMPTS * FULL_BLOCKS * BLOCK_SIZE
    assert counter.tokens_by_source == {
        "local_compute": 2 * NUM_PROMPTS * PROMPT_LEN - loaded,
        "local_cache_hit": 0,
        "external_kv_transfer": loaded,
    }
    assert counter.copied_bytes == {STORE: stored, LOAD: stored}  # nothing new stored
    assert all(transfer.seconds >= 0 for transfer in counter.transfers)


def test_the_prefix_cache_hit_comes_first_and_the_tier_brings_what_follows(tiny_llama):
    counter = StepTotals()
    engine = _engine(tiny_llama, counter, kv_transfer_config=offloading())
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    wanted = _generate(_engine(tiny_llama), [PROMPTS[0]], params)["0"]
    # The third prompt's blocks evict the first's from its tail (freed tail first), all but
    # its first two full blocks (the device's 16 blocks hold two prompts and two blocks).
    for i in range(3):
        _generate(engine, [PROMPTS[i]], params, start=i)
    before, prefix_hits = dict(counter.tokens_by_source), counter.prefix_hits
    assert _generate(engine, [PROMPTS[0]], params, start=3)["3"] == wanted
    assert counter.prefix_hits - prefix_hits == 2 * BLOCK_SIZE
    hit = counter.tokens_by_source["local_cache_hit"] - before["local_cache_hit"]
    external = counter.tokens_by_source["external_kv_transfer"] - before["external_kv_transfer"]
    assert (hit, external) == (2 * BLOCK_SIZE, (FULL_BLOCKS - 2) * BLOCK_SIZE)


@pytest.mark.parametrize(
    "overrides",
    [
        # two requests of seven blocks in fifteen, each growing to eight: one is preempted
        {"num_gpu_blocks_override": 15, "max_model_len": 240},
        {"max_num_batched_tokens": 32, "enable_chunked_prefill": True},
        {"enable_prefix_caching": False},
        {"async_scheduling": True},
    ],
    ids=["preemption", "chunked-prefill", "no-prefix-cache", "async-scheduling"],
)
def test_concurrent_requests_give_the_tokens_of_an_engine_without_the_tier(tiny_llama, overrides):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    wanted = _generate(_engine(tiny_llama, **overrides), PROMPTS * 2, params)
    counter = StepTotals()
    engine = _engine(tiny_llama, counter, kv_transfer_config=offloading(), **overrides)
    assert _generate(engine, PROMPTS * 2, params) == wanted
    assert _generate(engine, PROMPTS, params, start=10) == {
        str(10 + i): wanted[str(i)] for i in range(NUM_PROMPTS)
    }
    assert counter.tokens_by_source["external_kv_transfer"] > 0
    if "num_gpu_blocks_override" in overrides:
        assert counter.preemptions > 0
    scheduler = engine.engine_core.scheduler
    assert not scheduler.sending and not scheduler.waiting_for_remote_kvs
    manager = engine.engine_core.block_manager
    assert manager.num_free_blocks == manager.num_blocks  # nothing held after the end


def test_a_sliding_window_model_gives_the_tokens_of_an_engine_without_the_tier(model_factory):
    # every layer attends to its last 48 tokens: a request gives back blocks as it advances
    model = model_factory("MistralForCausalLM", sliding_window=48)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    wanted = _generate(_engine(model), PROMPTS * 2, params)
    counter = StepTotals()
    engine = _engine(model, counter, kv_transfer_config=offloading())
    assert _generate(engine, PROMPTS * 2, params) == wanted
    assert _generate(engine, PROMPTS, params, start=10) == {
        str(10 + i): wanted[str(i)] for i in range(NUM_PROMPTS)
    }
    assert counter.tokens_by_source["external_kv_transfer"] > 0


def test_a_finished_request_keeps_its_blocks_until_its_stores_are_done(tiny_llama):
    engine = _engine(tiny_llama, kv_transfer_config=offloading())
    core = engine.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=1)
    engine.add_request("0", PROMPTS[0], params)
    (output,) = engine.step()
    assert output.finished
    # its one step completed six blocks; their copy starts with the next step
    assert set(core.scheduler.sending) == {"0"}
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks - 7
    connector = core.scheduler.connector
    assert connector.tier.lookup(_prompt_hashes(core, PROMPTS[0])) == 0  # not findable yet
    assert engine.has_unfinished_requests()  # steps go on for the workers to report
    while core.scheduler.awaits_kv_transfer:
        engine.step()
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
    assert connector.tier.lookup(_prompt_hashes(core, PROMPTS[0])) == FULL_BLOCKS


def _prompt_hashes(core, prompt: list[int]) -> list:
    from infernetes.runtime.engine.request import Request

    request = Request("probe", prompt, SamplingParams(max_tokens=1))
    core.block_manager.find_cached_prefix(request)
    return request.block_hashes


def test_an_aborted_request_keeps_its_blocks_until_its_stores_are_done(tiny_llama):
    engine = _engine(tiny_llama, kv_transfer_config=offloading())
    core = engine.engine_core
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("0", PROMPTS[0], params)
    engine.step()
    engine.abort_request(["0"])
    assert set(core.scheduler.sending) == {"0"}
    while core.scheduler.awaits_kv_transfer:
        engine.step()
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


@pytest.mark.slow  # a worker process per rank
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_parallel_ranks_offload_their_own_shards(tiny_llama, tp, pp):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    wanted = _generate(_engine(tiny_llama), PROMPTS * 2, params)
    counter = StepTotals()
    engine = _engine(
        tiny_llama,
        counter,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        kv_transfer_config=offloading(),
    )
    try:
        assert _generate(engine, PROMPTS * 2, params) == wanted
        assert _generate(engine, PROMPTS, params, start=10) == {
            str(10 + i): wanted[str(i)] for i in range(NUM_PROMPTS)
        }
        assert counter.tokens_by_source["external_kv_transfer"] > 0
    finally:
        engine.shutdown()


def test_a_tier_smaller_than_the_working_set_keeps_the_most_recent_blocks(tiny_llama):
    counter = StepTotals()
    # room for two prompts' blocks: the last two evict the first two
    engine = _engine(tiny_llama, counter, kv_transfer_config=offloading(2 * FULL_BLOCKS))
    core = engine.engine_core
    wanted = _one_at_a_time(_engine(tiny_llama), rounds=1)
    assert _one_at_a_time(engine, rounds=1) == wanted
    tier = core.scheduler.connector.tier
    held = [tier.lookup(_prompt_hashes(core, prompt)) for prompt in PROMPTS]
    assert held == [0, 0, FULL_BLOCKS, FULL_BLOCKS]
    # the first prompt, evicted from both the device and the tier, is computed again
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    before = dict(counter.tokens_by_source)
    assert _generate(engine, [PROMPTS[0]], params, start=20)["20"] == wanted[0]
    assert counter.tokens_by_source["local_compute"] - before["local_compute"] == PROMPT_LEN


# -- the tier's index ---------------------------------------------------------------------------


A, B, C, D, E, F, X = range(1, 8)  # block hashes


def _stored(tier: HostTierIndex, hashes: list[int]) -> list[tuple[int, int]]:
    placed = tier.prepare_store(hashes)
    assert placed is not None
    tier.complete_store(hashes)
    return placed


def test_the_tier_evicts_the_least_recently_used_ready_unpinned_block():
    events = KVEventCollector()
    tier = HostTierIndex(3, BLOCK_SIZE, events)
    assert _stored(tier, [A, B, C]) == [(0, 0), (1, 1), (2, 2)]
    assert list(tier.blocks) == [C, B, A]  # a prefix's first block is the most recent
    tier.touch([C])
    assert tier.prepare_store([D]) == [(0, 1)]  # B was the least recently used
    assert list(tier.blocks) == [A, C, D]
    assert tier.lookup([A, D]) == 1  # D's copy is not done yet
    tier.prepare_load([C])  # pinned while it loads
    assert tier.prepare_store([E]) == [(0, 0)]  # A goes: C is pinned, D pending
    assert tier.prepare_store([F]) is None  # nothing left to evict: nothing changes
    assert list(tier.blocks) == [C, D, E]
    tier.complete_load([C])
    tier.complete_store([D, E])
    # C, held already, is part of this store and stays; D goes
    assert tier.prepare_store([F, C]) == [(0, 1)]
    assert list(tier.blocks) == [E, C, F]
    taken = events.take()
    kinds = [(type(e).__name__, len(e.block_hashes)) for e in taken]
    assert kinds == [
        ("BlockStored", 3),
        ("BlockRemoved", 1),
        ("BlockRemoved", 1),
        ("BlockStored", 2),
        ("BlockRemoved", 1),
    ]
    assert {e.medium for e in taken} == {MEDIUM_CPU}
    assert taken[0].block_size == BLOCK_SIZE


def test_a_lookup_counts_only_the_leading_ready_blocks():
    tier = HostTierIndex(4, BLOCK_SIZE)
    _stored(tier, [A, B, D])
    assert tier.lookup([A, B, C, D]) == 2
    assert tier.lookup([X, A]) == 0


# -- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "size", "backend", "message"),
    [
        (None, 0.0, "native", "--kv-offloading-size must be a positive number of GiB"),
        (None, 1.0, "lmcache", "only 'native'"),
        (offloading(), 1.0, "native", "give it or --kv-transfer-config, not both"),
        ({**offloading(), "kv_connector_extra_config": {}}, None, "native", "needs one of"),
        (
            {
                **offloading(),
                "kv_connector_extra_config": {"num_cpu_blocks": 8, "cpu_bytes_to_use": 8},
            },
            None,
            "native",
            "needs one of",
        ),
        (
            {**offloading(), "kv_connector_extra_config": {"num_cpu_blocks": -1}},
            None,
            "native",
            r"num_cpu_blocks must be a positive integer",
        ),
        (
            {**offloading(), "kv_connector_extra_config": {"num_cpu_blocks": 8, "block_size": 32}},
            None,
            "native",
            r"block_size 32: the host tier keeps blocks of the engine's --block-size \(16\)",
        ),
        (
            {
                **offloading(),
                "kv_connector_extra_config": {"num_cpu_blocks": 8, "eviction_policy": "arc"},
            },
            None,
            "native",
            "eviction_policy 'arc': only lru",
        ),
        (
            {**offloading(), "kv_connector_extra_config": {"num_cpu_blocks": 8, "spec_name": "X"}},
            None,
            "native",
            "spec_name 'X': only CPUOffloadingSpec",
        ),
        (
            {
                **offloading(),
                "kv_connector_extra_config": {"num_cpu_blocks": 8, "store_threshold": 2},
            },
            None,
            "native",
            r"unknown key\(s\) store_threshold; allowed: block_size, cpu_bytes_to_use",
        ),
    ],
)
def test_bad_offloading_settings_are_refused_by_name(given, size, backend, message):
    with pytest.raises(ValueError, match=message):
        kv_transfer_config(given, size, backend, BLOCK_SIZE)


def test_kv_offloading_size_is_the_offloading_connector_with_that_many_bytes():
    config = kv_transfer_config(None, 1.5, "native", BLOCK_SIZE)
    assert config is not None
    assert (config.kv_connector, config.kv_role) == ("OffloadingConnector", "kv_both")
    assert dict(config.kv_connector_extra_config) == {"cpu_bytes_to_use": 3 << 29}


def test_a_tier_smaller_than_one_block_is_refused(tiny_llama):
    config = {**offloading(), "kv_connector_extra_config": {"cpu_bytes_to_use": 1}}
    with pytest.raises(ValueError, match="host tier holds no block"):
        _engine(tiny_llama, kv_transfer_config=config)


def test_sleep_mode_with_the_host_tier_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="--enable-sleep-mode with KV offloading"):
        _engine(tiny_llama, kv_offloading_size=0.01, enable_sleep_mode=True)


def test_a_pooling_model_with_the_host_tier_is_refused(model_factory):
    with pytest.raises(ValueError, match="KV offloading serves generative models"):
        _engine(model_factory("BertModel"), kv_offloading_size=0.01)
