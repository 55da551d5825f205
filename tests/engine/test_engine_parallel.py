"""Tensor and pipeline parallelism end to end on the CPU: the engine starts one worker process
per rank (``MultiprocExecutor``, gloo). Tensor parallel ranks hold a shard of every layer
(attention heads split, KV heads split or replicated, vocabulary-parallel embedding and LM head,
row-parallel all-reduce); pipeline stages hold consecutive layers and pass the hidden states on,
the last stage's sampled tokens coming back to the others. Greedy tokens must equal transformers'
and TP 1's, logprobs TP 1's within float tolerance, under chunked prefill, prefix-cache hits and
preemption; each rank reads only its shard of the checkpoint; a worker that dies fails the
engine. The same with ``--distributed-executor-backend ray`` (one Ray actor per rank), and Ray
refused before anything starts where it is not installed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.executor.abstract import WorkerDiedError
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing import StepTotals

from infernetes.schema.config import build_config

LONG = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12, 7, 300, 5, 5, 60, 2, 33]
PROMPTS = [LONG, [1, 77, 4, 150, 6], [*LONG[:16], 9, 9]]  # the third shares two blocks
MAX_TOKENS = 12
ENGINE = {
    "dtype": "float32",
    "max_model_len": 40,
    "block_size": 8,
    # a small token budget chunks the prefills; 5 blocks for 3 requests of up to 4 preempt
    "num_gpu_blocks_override": 5,
    "max_num_batched_tokens": 8,
    "enable_prefix_caching": True,
}


def _generate(engine: LLMEngine) -> dict[str, tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                completion = output.outputs[0]
                logprobs = [
                    entry[t].logprob
                    for t, entry in zip(completion.token_ids, completion.logprobs, strict=True)
                ]
                results[output.request_id] = (completion.token_ids, logprobs)
    return results


def _engine(model: str, counter: StepTotals | None = None, **overrides) -> LLMEngine:
    config = build_config(model, device="cpu", **{**ENGINE, **overrides})
    return LLMEngine(config, stat_loggers=[counter] if counter else [])


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(
    ("architecture", "overrides", "tp", "pp", "heads_per_rank"),
    [
        ("LlamaForCausalLM", {}, 2, 1, (2, 1)),  # 4 query heads, 2 KV heads: one each
        ("LlamaForCausalLM", {"num_key_value_heads": 1}, 2, 1, (2, 1)),  # 1 KV head, replicated
        ("LlamaForCausalLM", {}, 4, 1, (1, 1)),  # 2 KV heads on 4 ranks: each replicated twice
        ("MistralForCausalLM", {}, 2, 1, (2, 1)),
        ("Qwen2ForCausalLM", {}, 2, 1, (2, 1)),
        ("Qwen3ForCausalLM", {}, 2, 1, (2, 1)),
        ("OPTForCausalLM", {}, 2, 1, (2, 2)),
        ("GPT2LMHeadModel", {}, 2, 1, (2, 2)),
        # experts sharded by intermediate size; Qwen2-MoE's shared expert and dense layer too
        ("Qwen2MoeForCausalLM", {}, 2, 1, (2, 1)),
        ("Qwen3MoeForCausalLM", {}, 2, 1, (2, 1)),
        ("MixtralForCausalLM", {}, 2, 1, (2, 1)),
        ("Gemma2ForCausalLM", {}, 2, 1, (2, 1)),
        ("Gemma3ForCausalLM", {}, 2, 1, (2, 1)),
        ("Phi3ForCausalLM", {}, 2, 1, (2, 1)),  # the fused checkpoint tensors cut per rank
        # latent attention: heads split, the one latent "KV head" replicated on every rank
        ("DeepseekV2ForCausalLM", {}, 2, 1, (2, 1)),
        ("DeepseekV3ForCausalLM", {}, 2, 1, (2, 1)),
        # a tied LM head on the last stage, the embedding on the first
        ("LlamaForCausalLM", {"tie_word_embeddings": True}, 1, 2, (4, 2)),
        ("MistralForCausalLM", {}, 1, 2, (4, 2)),
        ("Qwen2ForCausalLM", {}, 1, 2, (4, 2)),
        ("Qwen3ForCausalLM", {}, 1, 2, (4, 2)),
        ("OPTForCausalLM", {}, 1, 2, (4, 4)),
        ("GPT2LMHeadModel", {}, 1, 2, (4, 4)),
        ("Qwen2MoeForCausalLM", {}, 1, 2, (4, 2)),
        ("Gemma3ForCausalLM", {}, 1, 2, (4, 2)),
        ("DeepseekV3ForCausalLM", {}, 1, 2, (4, 1)),
        ("LlamaForCausalLM", {}, 2, 2, (2, 1)),
    ],
)
def test_parallel_matches_tp1_and_transformers(
    model_factory, hf_greedy, architecture, overrides, tp, pp, heads_per_rank
):
    model = model_factory(architecture, **overrides)
    expected = _generate(_engine(model))
    counter = StepTotals()
    engine = _engine(model, counter, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    core = engine.engine_core
    in_flight = []  # steps already in flight each time one is sent
    submit = core.executor.submit_model
    core.executor.submit_model = lambda output: (
        in_flight.append(len(core.batch_queue)),
        submit(output),
    )[1]
    try:
        reports = core.executor.collective_rpc("report")
        heads = [(r["attention_heads"], r["kv_heads"]) for r in reports]
        assert heads == [heads_per_rank] * tp * pp
        assert sum(r["attention_layers"] for r in reports) == 2 * tp  # each stage one of two
        results = _generate(engine)
    finally:
        engine.shutdown()
    assert counter.preemptions > 0 and counter.prefix_hits > 0
    # Pipeline stages overlap: a step is sent while another is in flight (the batch queue).
    assert max(in_flight, default=0) == pp - 1
    for i, prompt in enumerate(PROMPTS):
        tokens, logprobs = results[str(i)]
        assert tokens == hf_greedy(model, prompt, MAX_TOKENS) == expected[str(i)][0]
        assert logprobs == pytest.approx(expected[str(i)][1], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "architecture", ["Qwen2MoeForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM"]
)
def test_expert_parallel_matches_tp1_and_transformers(model_factory, hf_greedy, architecture):
    model = model_factory(architecture)
    expected = _generate(_engine(model))
    engine = _engine(model, tensor_parallel_size=2, enable_expert_parallel=True)
    try:
        experts = engine.engine_core.executor.collective_rpc("report")
        results = _generate(engine)
    finally:
        engine.shutdown()
    halves = [(0, 2), (2, 4)] if architecture == "MixtralForCausalLM" else [(0, 4), (4, 8)]
    assert [r["local_experts"] for r in experts] == halves
    for i, prompt in enumerate(PROMPTS):
        tokens, logprobs = results[str(i)]
        assert tokens == hf_greedy(model, prompt, MAX_TOKENS) == expected[str(i)][0]
        assert logprobs == pytest.approx(expected[str(i)][1], abs=1e-4)


@pytest.mark.slow
def test_pp_layer_partition_is_honoured(model_factory, hf_greedy, monkeypatch):
    model = model_factory("LlamaForCausalLM", num_hidden_layers=3)
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,2")
    engine = _engine(model, pipeline_parallel_size=2)
    try:
        reports = engine.engine_core.executor.collective_rpc("report")
        results = _generate(engine)
    finally:
        engine.shutdown()
    assert [r["attention_layers"] for r in reports] == [1, 2]
    assert results["0"][0] == hf_greedy(model, PROMPTS[0], MAX_TOKENS)
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "2,2")
    with pytest.raises(ValueError, match="VLLM_PP_LAYER_PARTITION=2,2 must give each of the 2"):
        _engine(model, pipeline_parallel_size=2)


@pytest.mark.slow
def test_each_rank_reads_only_its_shard(model_factory):
    model = model_factory("LlamaForCausalLM", tie_word_embeddings=False)
    total = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    engine = _engine(model, tensor_parallel_size=2)
    try:
        reads = [
            r["checkpoint_bytes_read"] for r in engine.engine_core.executor.collective_rpc("report")
        ]
    finally:
        engine.shutdown()
    # Every weight of the tiny Llama is split in two but the norms (a few hundred bytes).
    for read in reads:
        assert 0.45 * total < read < 0.55 * total, (read, total)


@pytest.mark.slow
def test_a_dead_worker_fails_the_engine(tiny_llama):
    engine = _engine(tiny_llama, tensor_parallel_size=2)
    executor = engine.engine_core.executor
    pids = [worker.process.pid for worker in executor.workers]
    try:
        os.kill(pids[1], signal.SIGKILL)
        executor.workers[1].process.wait(30)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            engine.engine_core.check_health()
        engine.add_request("0", PROMPTS[0], SamplingParams(max_tokens=4))
        with pytest.raises(WorkerDiedError, match="rank 1"):
            engine.step()
    finally:
        engine.shutdown()
    assert all(worker.process.poll() is not None for worker in executor.workers)


def test_head_counts_that_do_not_divide_fail_before_any_worker_starts(tiny_llama):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 does not divide the model's 4"):
        _engine(tiny_llama, tensor_parallel_size=3)


@pytest.fixture(scope="module")
def ray():
    """One local Ray for the module (an engine started inside it leaves it running)."""
    ray = pytest.importorskip("ray")
    ray.init(include_dashboard=False, num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.mark.slow  # a Ray actor per rank
@pytest.mark.parametrize(
    ("tp", "pp", "async_scheduling"), [(2, 1, False), (1, 2, False), (2, 1, True)]
)
def test_ray_ranks_match_tp1_and_transformers(ray, tiny_llama, hf_greedy, tp, pp, async_scheduling):
    reference = _engine(tiny_llama)
    try:
        expected = _generate(reference)
    finally:
        reference.shutdown()
    counter = StepTotals()
    engine = _engine(
        tiny_llama,
        counter,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        distributed_executor_backend="ray",
        async_scheduling=async_scheduling,
    )
    try:
        executor = engine.engine_core.executor
        assert type(executor).__name__ == "RayExecutor"
        assert len(executor.actors) == tp * pp
        assert executor.max_concurrent_batches == (2 if async_scheduling else pp)
        got = _generate(engine)
    finally:
        engine.shutdown()
    assert counter.preemptions > 0 and counter.prefix_hits > 0  # the paths were exercised
    for request_id, (tokens, logprobs) in expected.items():
        assert got[request_id][0] == tokens
        assert got[request_id][1] == pytest.approx(logprobs, abs=1e-4)
        assert tokens == hf_greedy(tiny_llama, PROMPTS[int(request_id)], MAX_TOKENS)
    assert ray.is_initialized()  # the module's Ray was not the engine's to stop


@pytest.mark.slow
def test_a_dead_ray_rank_fails_the_engine(ray, tiny_llama):
    engine = _engine(tiny_llama, tensor_parallel_size=2, distributed_executor_backend="ray")
    executor = engine.engine_core.executor
    try:
        pid = ray.get(executor.actors[1].pid.remote())
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            engine.engine_core.check_health()
        engine.add_request("0", PROMPTS[0], SamplingParams(max_tokens=4))
        with pytest.raises(WorkerDiedError, match="rank 1"):
            engine.step()
    finally:
        engine.shutdown()
    assert executor.actors == []


def test_ray_is_refused_where_it_is_not_installed(monkeypatch, tiny_llama):
    import importlib.util

    from infernetes.runtime.executor.backend_check import check_executor_backend

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(ValueError, match="ray needs Ray, which is not installed here"):
        check_executor_backend("ray")
    with pytest.raises(ValueError, match="pip install 'infernetes\\[ray\\]'"):
        _engine(tiny_llama, tensor_parallel_size=2, distributed_executor_backend="ray")
    check_executor_backend("mp")  # the others need nothing more
