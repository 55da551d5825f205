"""--async-scheduling end to end on the tiny models: the next step is scheduled while the worker
thread runs this one, of the same requests, their last token fed from the worker's own state.
Greedy tokens equal transformers' and the synchronous engine's, logprobs the synchronous
engine's, under chunked prefill, prefix-cache hits, preemption, n > 1, penalties, stops that end a
request with a step still in flight, and aborts of requests in flight; the KV blocks all come
back."""

from __future__ import annotations

import math
import threading

import pytest
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.testing import SAMPLE_PROMPTS as PROMPTS
from infernetes.runtime.testing import StepTotals

from infernetes import LLM, SamplingParams
from infernetes.schema.config import build_config

BASE = {"dtype": "float32", "max_model_len": 128, "block_size": 8}


def _llm(model: str, counter: StepTotals | None = None, **settings) -> LLM:
    llm = LLM(model, **{**BASE, **settings})
    if counter is not None:
        llm.llm_engine.engine_core.stat_loggers.append(counter)
    return llm


def _completions(outputs) -> list[tuple]:
    """Everything a completion says, logprobs rounded to the float tolerance."""
    result = []
    for output in outputs:
        for c in output.outputs:
            logprobs = [
                {t: round(lp.logprob, 4) for t, lp in entry.items()} for entry in c.logprobs or []
            ]
            result.append((c.token_ids, c.text, c.finish_reason, c.stop_reason, logprobs, c.index))
    return result


def _same(sync_outputs, async_outputs) -> None:
    expected, got = _completions(sync_outputs), _completions(async_outputs)
    assert [e[:4] for e in expected] == [g[:4] for g in got]
    for e, g in zip(expected, got, strict=True):
        for a, b in zip(e[4], g[4], strict=True):
            assert a.keys() == b.keys()
            assert all(math.isclose(a[k], b[k], abs_tol=2e-4) for k in a)


def _both(model: str, prompts, params, **settings) -> tuple[list, list, LLM]:
    """The synchronous engine's outputs, the async one's, and the async LLM."""
    sync = _llm(model, **settings).generate(prompts, params)
    llm = _llm(model, async_scheduling=True, **settings)
    return sync, llm.generate(prompts, params), llm


def _check_transformers(hf_greedy, llm: LLM, model: str, outputs, max_tokens: int) -> None:
    tokenizer = llm.get_tokenizer()
    for output in outputs:
        ids = tokenizer(output.prompt).input_ids
        assert output.outputs[0].token_ids == hf_greedy(model, ids, max_tokens)


def _all_blocks_free(llm: LLM) -> bool:
    core = llm.llm_engine.engine_core
    return core.block_manager.num_free_blocks == core.num_blocks


GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)


def test_steps_overlap_on_the_worker_thread(tiny_llama, hf_greedy):
    llm = _llm(tiny_llama, async_scheduling=True, num_gpu_blocks_override=64)
    core = llm.llm_engine.engine_core
    assert core.executor.max_concurrent_batches == 2
    in_flight: list[int] = []  # steps already in flight each time one is sent
    submit = core.executor.submit_model
    core.executor.submit_model = lambda output: (in_flight.append(len(core.batch_queue)), submit(output))[1]  # fmt: skip
    threads: set[str] = set()

    def where(output_ids, logits):
        threads.add(threading.current_thread().name)
        return logits

    params = SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True, logits_processors=[where]
    )
    outputs = llm.generate(PROMPTS, params)
    assert max(in_flight) == 1  # a step was sent while the one before it ran
    assert threads and all(name.startswith("infernetes-worker") for name in threads)
    _check_transformers(hf_greedy, llm, tiny_llama, outputs, 16)
    assert _all_blocks_free(llm)


@pytest.mark.parametrize(
    "settings",
    [
        {"num_gpu_blocks_override": 64},
        # a budget of 8 tokens splits every prompt into chunks mixed with decodes
        {"num_gpu_blocks_override": 64, "max_num_batched_tokens": 8},
        {"num_gpu_blocks_override": 64, "long_prefill_token_threshold": 5},
    ],
    ids=["batch", "chunked-prefill", "long-prefill-threshold"],
)
def test_greedy_matches_sync_and_transformers(tiny_llama, hf_greedy, settings):
    sync, got, llm = _both(tiny_llama, PROMPTS, GREEDY, **settings)
    _same(sync, got)
    _check_transformers(hf_greedy, llm, tiny_llama, got, 16)
    assert _all_blocks_free(llm)


def test_prompt_logprobs_under_chunked_prefill(tiny_llama):
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2, ignore_eos=True)
    settings = {"num_gpu_blocks_override": 64, "max_num_batched_tokens": 8}
    sync, got, _ = _both(tiny_llama, PROMPTS, params, **settings)
    _same(sync, got)
    for a, b in zip(sync, got, strict=True):
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs) == len(a.prompt_token_ids)
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert x.keys() == y.keys()
            assert all(math.isclose(x[k].logprob, y[k].logprob, abs_tol=2e-4) for k in x)


def test_prefix_cache_hit(tiny_llama, hf_greedy):
    counter = StepTotals()
    llm = _llm(tiny_llama, counter, async_scheduling=True, num_gpu_blocks_override=64)
    shared = PROMPTS[3]
    first = llm.generate(shared + " One", GREEDY)
    second = llm.generate([shared + " Two", shared + " Three"], GREEDY)
    assert second[0].num_cached_tokens >= 16 and counter.prefix_hits > 0
    _check_transformers(hf_greedy, llm, tiny_llama, first + second, 16)


@pytest.mark.parametrize(
    ("policy", "caching"), [("fcfs", False), ("priority", False), ("fcfs", True)]
)
def test_preemption_of_requests_in_flight(tiny_llama, hf_greedy, policy, caching):
    counter = StepTotals()
    settings = {
        "max_model_len": 64,
        "num_gpu_blocks_override": 10,
        "scheduling_policy": policy,
        "enable_prefix_caching": caching,
    }
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)
    llm = _llm(tiny_llama, counter, async_scheduling=True, **settings)
    priority = [0, 1, 2, 3] if policy == "priority" else None
    outputs = llm.generate(PROMPTS, params, priority=priority)
    assert counter.preemptions > 0
    _check_transformers(hf_greedy, llm, tiny_llama, outputs, 24)
    _same(_llm(tiny_llama, **settings).generate(PROMPTS, params, priority=priority), outputs)
    assert _all_blocks_free(llm)


def test_seeded_sampling_and_n_survive_preemption(tiny_llama):
    """A preemption discards the draw of the step in flight; the seeded stream goes on as the
    synchronous engine's, which never preempted."""
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=7 + i, max_tokens=24, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    params[1] = SamplingParams(n=3, temperature=0.8, seed=3, max_tokens=20, ignore_eos=True)
    roomy = _llm(tiny_llama, max_model_len=64, num_gpu_blocks_override=64).generate(PROMPTS, params)
    counter = StepTotals()
    tight = _llm(
        tiny_llama, counter, async_scheduling=True, max_model_len=64, num_gpu_blocks_override=10
    )
    assert counter.preemptions == 0
    got = tight.generate(PROMPTS, params)
    assert counter.preemptions > 0
    assert len(got[1].outputs) == 3
    _same(roomy, got)
    assert _all_blocks_free(tight)


def test_stops_with_a_step_in_flight(tiny_llama):
    """Each request ends on a token the scheduler sees one step late: the step already scheduled
    after it computes a token nobody sees."""
    llm = _llm(tiny_llama, num_gpu_blocks_override=64)
    full = llm.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=16))[0].outputs[0]
    stop_text = full.text[5:8]
    stop_token = full.token_ids[3]
    eos = llm.get_tokenizer().eos_token_id
    params = [
        SamplingParams(temperature=0.0, max_tokens=16, stop=[stop_text]),
        SamplingParams(
            temperature=0.0, max_tokens=16, stop=stop_text, include_stop_str_in_output=True
        ),
        SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.0, max_tokens=16, logit_bias={eos: 100.0}),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
    ]
    prompts = [PROMPTS[1]] * 3 + PROMPTS[:3]
    sync, got, async_llm = _both(tiny_llama, prompts, params, num_gpu_blocks_override=64)
    _same(sync, got)
    reasons = [(o.outputs[0].finish_reason, o.outputs[0].stop_reason) for o in got]
    assert reasons == [
        ("stop", stop_text),
        ("stop", stop_text),
        ("stop", stop_token),
        ("stop", None),
        ("length", None),
        ("length", None),
    ]
    assert got[3].outputs[0].token_ids == [eos]
    assert _all_blocks_free(async_llm)


def test_penalties_and_logits_processors_see_every_token(tiny_llama):
    seen: list[list[int]] = []

    def record(output_ids, logits):
        seen.append(list(output_ids))
        return logits

    params = SamplingParams(
        temperature=0.0,
        max_tokens=12,
        ignore_eos=True,
        repetition_penalty=1.5,
        frequency_penalty=0.5,
        presence_penalty=0.3,
        logits_processors=[record],
        logprobs=1,
    )
    sync = _llm(tiny_llama, num_gpu_blocks_override=64).generate(PROMPTS[2], params)
    seen_sync, seen[:] = list(seen), []
    got = _llm(tiny_llama, async_scheduling=True, num_gpu_blocks_override=64).generate(
        PROMPTS[2], params
    )
    _same(sync, got)
    assert seen == seen_sync  # the processor saw each output token, once, in order


def test_abort_of_requests_in_flight(tiny_llama, hf_greedy):
    config = build_config(
        tiny_llama, **BASE, num_gpu_blocks_override=40, async_scheduling=True, device="cpu"
    )
    engine = LLMEngine(config)
    core = engine.engine_core
    try:
        params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"r{i}", prompt, params)
        for _ in range(4):
            engine.step()
        assert len(core.batch_queue) == 1  # a step of every running request is in flight
        aborted = engine.abort_request(["r0", "r2"])
        assert [o.outputs[0].finish_reason for o in aborted] == ["abort", "abort"]
        # the ids come back at once for new requests; the step in flight gives them nothing
        engine.add_request("r0", PROMPTS[2], params)
        finished = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                assert output.request_id != "r2"
                if output.finished:
                    finished[output.request_id] = output
        assert set(finished) == {"r0", "r1", "r3"}
        assert core.block_manager.num_free_blocks == 40
        assert core.scheduler.num_running == core.scheduler.num_waiting == 0
        tokenizer = core.tokenizer
        for request_id, prompt in (("r0", PROMPTS[2]), ("r1", PROMPTS[1]), ("r3", PROMPTS[3])):
            expected = hf_greedy(tiny_llama, tokenizer(prompt).input_ids, 30)
            assert finished[request_id].outputs[0].token_ids == expected
    finally:
        engine.shutdown()


def test_sleep_takes_the_steps_in_flight_back(tiny_llama, hf_greedy):
    llm = _llm(
        tiny_llama, async_scheduling=True, num_gpu_blocks_override=64, enable_sleep_mode=True
    )
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request("a", PROMPTS[0], params)
    for _ in range(3):
        engine.step()
    engine.engine_core.sleep(1)
    assert not engine.engine_core.batch_queue
    engine.engine_core.wake_up()
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.finished]
    ids = llm.get_tokenizer()(PROMPTS[0]).input_ids
    assert outputs[0].outputs[0].token_ids == hf_greedy(tiny_llama, ids, 12)


def test_embeddings_under_async_scheduling(model_factory):
    path = model_factory("BertModel")
    sentences = ["the cat sat", "a much longer sentence about nothing at all", "hi"]
    expected = LLM(path, dtype="float32", max_model_len=128, task="embed").embed(sentences)
    got = LLM(path, dtype="float32", max_model_len=128, task="embed", async_scheduling=True)
    for a, b in zip(expected, got.embed(sentences), strict=True):
        assert a.outputs.embedding == pytest.approx(b.outputs.embedding, abs=1e-5)


def test_refused_with_pipeline_parallelism(tiny_llama):
    with pytest.raises(ValueError, match=r"--async-scheduling.*--pipeline-parallel-size"):
        LLM(tiny_llama, async_scheduling=True, pipeline_parallel_size=2)


@pytest.mark.slow  # two worker processes
def test_tensor_parallel_worker_processes(tiny_llama, hf_greedy):
    """With --distributed-executor-backend mp each rank takes the next step as soon as it has
    sent this one's output; every rank keeps the tokens it sampled."""
    counter = StepTotals()
    config = build_config(
        tiny_llama,
        **{**BASE, "max_model_len": 64},
        device="cpu",
        tensor_parallel_size=2,
        async_scheduling=True,
        num_gpu_blocks_override=10,
    )
    engine = LLMEngine(config, stat_loggers=[counter])
    core = engine.engine_core
    assert core.executor.max_concurrent_batches == 2
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    try:
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(str(i), prompt, params)
        finished = {}
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
    finally:
        engine.shutdown()
    assert counter.preemptions > 0
    for i, prompt in enumerate(PROMPTS):
        ids = core.tokenizer(prompt).input_ids
        assert finished[str(i)].outputs[0].token_ids == hf_greedy(tiny_llama, ids, 24)


def test_one_engines_step_does_not_clear_another_threads_attention_metadata():
    """Two engines in one process each run their forward on their own thread: one ending its step
    (metadata cleared) must leave the other's step running (a flaky failure before it was
    per thread)."""
    import torch
    from infernetes.runtime.model_executor import context

    meta = context.AttentionMetadata(*(torch.zeros(1, dtype=torch.int32) for _ in range(4)))
    context.set_attention_metadata(meta)
    other = threading.Thread(target=context.set_attention_metadata, args=(None,))
    other.start()
    other.join()
    assert context.get_attention_metadata() is meta
    seen: list[BaseException] = []

    def read() -> None:
        try:
            context.get_attention_metadata()
        except RuntimeError as e:
            seen.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    context.set_attention_metadata(None)
    assert seen and "outside a ModelRunner step" in str(seen[0])
