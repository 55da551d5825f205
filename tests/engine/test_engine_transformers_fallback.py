"""The transformers fallback: architectures with no native implementation here run through
transformers' modelling code with this engine's paged attention, and give transformers' tokens."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing import FAMILY_CONFIGS, SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams

SMALL = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8)


def _assert_exact(llm, path, hf_greedy, prompts, max_tokens=10):
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for prompt, output in zip(prompts, llm.generate(prompts, params), strict=True):
        ids = tokenizer(prompt).input_ids
        assert output.outputs[0].token_ids == hf_greedy(path, ids, max_tokens), prompt


def _model(llm):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner.model


@pytest.mark.parametrize("architecture", sorted(FAMILY_CONFIGS))
def test_fallback_matches_transformers(model_factory, hf_greedy, architecture):
    path = model_factory(architecture)
    llm = LLM(path, model_impl="transformers", **SMALL)
    assert type(_model(llm)).__name__ == "TransformersForCausalLM"
    _assert_exact(llm, path, hf_greedy, SAMPLE_PROMPTS)
    # chunked prefill, a prefix-cache hit and preemption (8 blocks for 3 requests of 6)
    tight = LLM(
        path,
        model_impl="transformers",
        **{**SMALL, "max_model_len": 64, "num_gpu_blocks_override": 8, "max_num_batched_tokens": 8},
    )
    prompts = [SAMPLE_PROMPTS[1], SAMPLE_PROMPTS[1] + " again", SAMPLE_PROMPTS[3]]
    _assert_exact(tight, path, hf_greedy, prompts, max_tokens=12)


def test_model_impl_transformers_runs_a_native_architecture_through_the_fallback(
    model_factory, hf_greedy
):
    path = model_factory("Qwen3ForCausalLM")
    llm = LLM(path, model_impl="transformers", **SMALL)
    assert type(_model(llm)).__name__ == "TransformersForCausalLM"
    _assert_exact(llm, path, hf_greedy, SAMPLE_PROMPTS[:2])


def test_model_impl_vllm_refuses_an_architecture_only_the_fallback_runs(model_factory):
    path = model_factory("Olmo2ForCausalLM")
    with pytest.raises(ValueError, match=r"Olmo2ForCausalLM.*not supported.*--model-impl auto"):
        LLM(path, model_impl="vllm", **SMALL)


def test_an_architecture_neither_path_runs_is_named(model_factory, tmp_path):
    import json
    import shutil

    shutil.copytree(model_factory("LlamaForCausalLM"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"NoSuchModelForCausalLM.*transformers fallback cannot"):
        LLM(str(tmp_path / "m"), **SMALL)


def test_fallback_refuses_tensor_parallelism_without_a_plan(model_factory):
    # transformers gives gpt-oss no base_model_tp_plan: refused before any worker starts
    with pytest.raises(ValueError, match="GptOssForCausalLM has no tensor-parallel plan"):
        LLM(model_factory("GptOssForCausalLM"), tensor_parallel_size=2, **SMALL)


def test_fallback_refuses_pipeline_parallelism(model_factory):
    with pytest.raises(ValueError, match="transformers fallback, which runs as one pipeline stage"):
        LLM(model_factory("Olmo2ForCausalLM"), pipeline_parallel_size=2, **SMALL)


@pytest.mark.slow  # a worker process per rank
@pytest.mark.parametrize(
    ("architecture", "heads_per_rank"),
    [
        ("GraniteForCausalLM", 2),  # every projection split
        ("Olmo2ForCausalLM", 4),  # attention replicated (its q/k norms span all heads); MLP split
        ("Gemma2ForCausalLM", 2),  # soft-capping and windows on split heads
    ],
)
def test_fallback_under_tensor_parallelism_matches_transformers(
    model_factory, hf_greedy, architecture, heads_per_rank
):
    from pathlib import Path

    from infernetes.runtime.engine.llm_engine import LLMEngine

    from infernetes.schema.config import build_config

    path = model_factory(architecture)
    engine = LLMEngine(
        build_config(path, device="cpu", tensor_parallel_size=2, model_impl="transformers", **SMALL)
    )
    try:
        reports = engine.engine_core.executor.collective_rpc("report")
        prompts = [[0, 398, 340, 321, 455, 80, 72], [0, 37], list(range(5, 40))]
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        results = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    results[output.request_id] = output.outputs[0].token_ids
    finally:
        engine.shutdown()
    assert [r["attention_heads"] for r in reports] == [heads_per_rank] * 2
    checkpoint = (Path(path) / "model.safetensors").stat().st_size
    assert all(r["checkpoint_bytes_read"] < 0.9 * checkpoint for r in reports)  # its slices
    for i, prompt in enumerate(prompts):
        assert results[str(i)] == hf_greedy(path, prompt, 10)


@pytest.mark.parametrize(
    ("architecture", "reason"),
    [
        ("StableLmForCausalLM", "does not route its attention through transformers' attention"),
        ("FalconForCausalLM", "does not route its attention through transformers' attention"),
    ],
)
def test_what_the_fallback_cannot_run_is_refused_with_its_reason(tmp_path, architecture, reason):
    import transformers
    from infernetes.runtime.testing import build_tokenizer

    build_tokenizer(tmp_path)
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    config = config_class(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=reason):
        LLM(str(tmp_path), load_format="dummy", **SMALL)
