"""AsyncEngine: streams per request, output kinds, abort, stats loggers, errors, sleep."""

from __future__ import annotations

import asyncio

import pytest
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.sampling_params import RequestOutputKind, SamplingParams
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes.schema.config import build_config


class Recorder:
    def __init__(self):
        self.records = []

    def record(self, scheduler_stats, iteration_stats):
        self.records.append((scheduler_stats, iteration_stats))


@pytest.fixture
async def engine_and_stats(tiny_llama):
    recorder = Recorder()
    config = build_config(
        model=tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        block_size=8,
        enable_sleep_mode=True,
    )
    engine = AsyncEngine.from_config(config, stat_loggers=[recorder])
    yield engine, recorder
    await engine.shutdown()


async def _collect(engine, prompt, params, request_id, priority=0):
    return [out async for out in engine.generate(prompt, params, request_id, priority=priority)]


async def test_concurrent_streams_match_offline_greedy(engine_and_stats, hf_greedy, tiny_llama):
    engine, recorder = engine_and_stats
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    results = await asyncio.gather(
        *(_collect(engine, prompt, params, f"req-{i}") for i, prompt in enumerate(SAMPLE_PROMPTS))
    )
    for prompt, outputs in zip(SAMPLE_PROMPTS, results, strict=True):
        final = outputs[-1]
        assert final.finished and all(not o.finished for o in outputs[:-1])
        ids = engine.tokenizer(prompt).input_ids
        assert final.outputs[0].token_ids == hf_greedy(tiny_llama, ids, 10)
        # cumulative outputs grow with every step (a consumer behind takes several at once)
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
        assert lengths == sorted(set(lengths)) and lengths[-1] == 10
    finished = [f for _, it in recorder.records for f in it.finished_requests]
    assert sorted(f.request_id for f in finished) == [f"req-{i}" for i in range(4)]
    assert all(f.finish_reason == "length" and f.num_generation_tokens == 10 for f in finished)
    assert sum(it.num_generation_tokens for _, it in recorder.records) == 40
    prompt_tokens = sum(len(engine.tokenizer(p).input_ids) for p in SAMPLE_PROMPTS)
    assert sum(it.num_prompt_tokens for _, it in recorder.records) == prompt_tokens
    assert len([t for _, it in recorder.records for t in it.time_to_first_tokens_iter]) == 4
    assert len([t for _, it in recorder.records for t in it.inter_token_latencies_iter]) == 36
    last_scheduler_stats = recorder.records[-1][0]
    assert last_scheduler_stats.num_running_reqs == 0 and last_scheduler_stats.kv_cache_usage == 0.0


async def test_delta_and_final_only_kinds(engine_and_stats):
    engine, _ = engine_and_stats
    base = dict(temperature=0.0, max_tokens=8, ignore_eos=True)
    cumulative = await _collect(engine, SAMPLE_PROMPTS[0], SamplingParams(**base), "c")
    delta = await _collect(
        engine, SAMPLE_PROMPTS[0], SamplingParams(**base, output_kind=RequestOutputKind.DELTA), "d"
    )
    final = await _collect(
        engine,
        SAMPLE_PROMPTS[0],
        SamplingParams(**base, output_kind=RequestOutputKind.FINAL_ONLY),
        "f",
    )
    full = cumulative[-1].outputs[0]
    assert [t for o in delta for t in o.outputs[0].token_ids] == full.token_ids
    assert "".join(o.outputs[0].text for o in delta) == full.text
    assert len(final) == 1 and final[0].outputs[0].token_ids == full.token_ids


async def _behind(engine, params, request_id):
    """The outputs of a consumer that stalls after the first one while the steps go on."""
    outputs = []
    async for output in engine.generate(SAMPLE_PROMPTS[2], params, request_id):
        if not outputs:
            await asyncio.sleep(2.0)  # the steps go on: milliseconds each
        outputs.append(output)
    return outputs


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
async def test_a_consumer_behind_takes_the_queued_outputs_as_one(engine_and_stats, kind):
    """What queued while the consumer stalled comes as one output: deltas joined (text, tokens,
    logprobs of both samples), or the latest cumulative one; the same tokens as a prompt
    consumer sees."""
    engine, _ = engine_and_stats
    params = SamplingParams(
        n=2, temperature=0.8, seed=7, max_tokens=24, ignore_eos=True, logprobs=1, output_kind=kind
    )
    prompt = await _collect(engine, SAMPLE_PROMPTS[2], params, "prompt")
    behind = await _behind(engine, params, "behind")
    assert len(behind) < len(prompt) and len(behind) <= 3
    assert behind[-1].finished and not any(o.finished for o in behind[:-1])

    def samples(outputs):
        joined = {}
        for output in outputs:
            for c in output.outputs:
                text, tokens, logprobs = joined.get(c.index, ("", [], []))
                if kind == RequestOutputKind.DELTA:
                    joined[c.index] = (text + c.text, tokens + c.token_ids, logprobs + c.logprobs)
                else:
                    joined[c.index] = (c.text, c.token_ids, c.logprobs)
        return joined

    got, want = samples(behind), samples(prompt)
    assert sorted(got) == [0, 1]
    for index in (0, 1):
        assert got[index][:2] == want[index][:2]
        assert len(got[index][1]) == len(got[index][2]) == 24
        assert [list(p) for p in got[index][2]] == [list(p) for p in want[index][2]]


async def test_abort_frees_blocks_and_prefix_cache_stats(engine_and_stats):
    engine, recorder = engine_and_stats
    params = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    stream = engine.generate(SAMPLE_PROMPTS[1], params, "long")
    first = await stream.__anext__()
    assert not first.finished
    await engine.abort("long")
    rest = [o async for o in stream]
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    # closing a stream early aborts too
    other = engine.generate(SAMPLE_PROMPTS[3], params, "closed")
    await other.__anext__()
    await other.aclose()
    for _ in range(100):
        if not engine.engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert engine.engine.block_manager.num_free_blocks == engine.engine.num_blocks
    assert (
        recorder.records[-1][0].kv_cache_usage == 0.0
        and recorder.records[-1][0].num_running_reqs == 0
    )
    aborted = [
        f for _, it in recorder.records for f in it.finished_requests if f.finish_reason == "abort"
    ]
    assert sorted(f.request_id for f in aborted) == ["closed", "long"]
    # the same long prompt again hits the prefix cache
    await _collect(
        engine, SAMPLE_PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=2), "again"
    )
    stats = [s.prefix_cache_stats for s, _ in recorder.records]
    assert sum(s.hits for s in stats) > 0 and sum(s.queries for s in stats) >= sum(
        s.hits for s in stats
    )
    assert await engine.reset_prefix_cache() is True


async def test_bad_requests_fail_alone(engine_and_stats):
    engine, _ = engine_and_stats
    good = asyncio.ensure_future(
        _collect(
            engine,
            SAMPLE_PROMPTS[0],
            SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
            "ok",
        )
    )
    with pytest.raises(ValueError, match="maximum context length is 128"):
        await _collect(engine, SAMPLE_PROMPTS[0], SamplingParams(max_tokens=1000), "too-long")
    with pytest.raises(ValueError, match=r"logprobs of 21.*maximum allowed.*20"):
        await _collect(engine, SAMPLE_PROMPTS[0], SamplingParams(logprobs=21), "lp")
    with pytest.raises(ValueError, match="longer than the maximum model length of 128"):
        await _collect(engine, list(range(200)), SamplingParams(max_tokens=1), "prompt")
    outputs = await good
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert not engine.errored


async def test_requests_are_prepared_before_the_core(engine_and_stats, monkeypatch):
    # Tokenized and checked on this side: the core gets token ids, and a bad request never
    # reaches it.
    engine, _ = engine_and_stats
    sent = []
    send = engine.cores[0].send

    def recording(command):
        sent.append(command)
        send(command)

    monkeypatch.setattr(engine.cores[0], "send", recording)
    with pytest.raises(ValueError, match="maximum context length is 128"):
        await _collect(engine, SAMPLE_PROMPTS[0], SamplingParams(max_tokens=1000), "too-long")
    assert sent == []
    await _collect(engine, SAMPLE_PROMPTS[1], SamplingParams(max_tokens=2), "ok")
    request = sent[0].request
    assert request.prompt == SAMPLE_PROMPTS[1]
    assert request.prompt_token_ids == engine.tokenizer(SAMPLE_PROMPTS[1]).input_ids
    assert request.params.max_tokens == 2


async def test_sleep_and_wake_up(engine_and_stats):
    engine, _ = engine_and_stats
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    before = await _collect(engine, SAMPLE_PROMPTS[2], params, "a")
    await engine.sleep(1)
    assert engine.is_sleeping
    await engine.wake_up()
    assert not engine.is_sleeping
    after = await _collect(engine, SAMPLE_PROMPTS[2], params, "b")
    assert before[-1].outputs[0].token_ids == after[-1].outputs[0].token_ids


async def test_engine_death_reaches_every_stream(tiny_llama):
    from infernetes.runtime.engine.async_engine import EngineDeadError

    config = build_config(
        model=tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=32
    )
    engine = AsyncEngine.from_config(config)

    def explode(batch):
        raise RuntimeError("device lost")

    engine.engine.executor.driver_worker.model_runner.execute_model = explode
    with pytest.raises(EngineDeadError, match="device lost"):
        await _collect(engine, SAMPLE_PROMPTS[0], SamplingParams(max_tokens=3), "doomed")
    assert engine.errored and "device lost" in repr(engine.dead_error)
    with pytest.raises(EngineDeadError):
        await _collect(engine, SAMPLE_PROMPTS[0], SamplingParams(max_tokens=3), "after")
    await engine.shutdown()


async def test_encode_embeddings(model_factory):
    config = build_config(model=model_factory("BertModel"), dtype="float32", max_model_len=64)
    engine = AsyncEngine.from_config(config)
    try:
        outputs = await asyncio.gather(
            *(engine.encode(p, f"e{i}") for i, p in enumerate(SAMPLE_PROMPTS))
        )
        assert [o.request_id for o in outputs] == ["e0", "e1", "e2", "e3"]
        assert all(len(o.outputs.embedding) == 64 and o.finished for o in outputs)
        with pytest.raises(ValueError, match="longer than the maximum model length of 64"):
            await engine.encode(list(range(5, 100)), "long")
    finally:
        await engine.shutdown()
