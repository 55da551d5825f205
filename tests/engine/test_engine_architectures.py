"""Every architecture, built tiny and random, generates exactly what transformers generates."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing import SAMPLE_PROMPTS, StepTotals

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)

ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}


def _assert_exact(llm, path, hf_greedy, prompts=SAMPLE_PROMPTS, max_tokens=10):
    tokenizer = llm.get_tokenizer()
    outputs = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = tokenizer(prompt).input_ids
        assert output.outputs[0].token_ids == hf_greedy(path, ids, max_tokens), prompt


@pytest.mark.parametrize(
    "architecture",
    [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "MixtralForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "OPTForCausalLM",
        "GPT2LMHeadModel",
    ],
)
def test_architecture_matches_transformers(model_factory, hf_greedy, architecture):
    path = model_factory(architecture)
    llm = LLM(path, dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8)
    _assert_exact(llm, path, hf_greedy)
    # chunked prefill and a prefix-cache hit on the same model stay exact
    chunked = LLM(
        path,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        block_size=8,
        max_num_batched_tokens=8,
    )
    prompts = [SAMPLE_PROMPTS[1], SAMPLE_PROMPTS[1] + " again"]
    _assert_exact(chunked, path, hf_greedy, prompts)
    assert chunked.generate(prompts[1], GREEDY)[0].num_cached_tokens > 0


@pytest.mark.parametrize("variant", sorted(ROPE_SCALINGS))
def test_llama_rope_scaling_matches_transformers(model_factory, hf_greedy, variant):
    path = model_factory(
        "LlamaForCausalLM", rope_parameters={**ROPE_SCALINGS[variant], "rope_theta": 10000.0}
    )
    llm = LLM(path, dtype="float32", max_model_len=256, num_gpu_blocks_override=64, block_size=8)
    _assert_exact(llm, path, hf_greedy, SAMPLE_PROMPTS[:2])


# Prompts longer than the window, generation that goes on past it; chunked prefill (a chunk's
# queries see different windows) and a prefix-cache hit on the long prompt.
LONG_PROMPTS = [" ".join(SAMPLE_PROMPTS) * 2, SAMPLE_PROMPTS[1] * 3]


@pytest.mark.parametrize(
    ("architecture", "overrides"),
    [
        ("MistralForCausalLM", {"sliding_window": 16}),
        ("Qwen2ForCausalLM", {"sliding_window": 16, "use_sliding_window": True}),
        ("MixtralForCausalLM", {"sliding_window": 16}),
        # Gemma 3's local layers slide, its global ones do not (a fallback architecture)
        ("Gemma3ForCausalLM", {"sliding_window": 16}),
        ("Gemma2ForCausalLM", {"sliding_window": 16}),
        ("GptOssForCausalLM", {"sliding_window": 16}),  # and attention sinks
    ],
)
def test_sliding_window_past_the_window_matches_transformers(
    model_factory, hf_greedy, architecture, overrides
):
    path = model_factory(architecture, **overrides)
    for budget in (None, 8):
        llm = LLM(
            path,
            dtype="float32",
            max_model_len=256,
            num_gpu_blocks_override=96,
            block_size=8,
            max_num_batched_tokens=budget,
        )
        assert len(llm.get_tokenizer()(LONG_PROMPTS[0]).input_ids) > 3 * 16
        _assert_exact(llm, path, hf_greedy, [*LONG_PROMPTS, LONG_PROMPTS[0]], max_tokens=24)


@pytest.mark.parametrize(
    ("architecture", "overrides", "releases"),
    [
        ("MistralForCausalLM", {"sliding_window": 16}, True),  # every layer slides
        ("Gemma2ForCausalLM", {"sliding_window": 16}, False),  # its global layers need them all
    ],
)
def test_blocks_behind_every_layers_window_go_back(
    model_factory, hf_greedy, architecture, overrides, releases
):
    """Four long requests at once in a cache that holds two of them whole: where every layer
    slides, each keeps about a window of blocks and none is preempted; transformers' tokens."""
    from infernetes.runtime.engine.llm_engine import LLMEngine

    from infernetes.schema.config import build_config

    path = model_factory(architecture, **overrides)
    totals = StepTotals()
    config = build_config(
        path, dtype="float32", max_model_len=128, block_size=8, num_gpu_blocks_override=24
    )
    engine = LLMEngine(config, stat_loggers=[totals])
    tokenizer = engine.tokenizer
    prompts = [tokenizer(text).input_ids[:80] for text in [*LONG_PROMPTS, *LONG_PROMPTS]]
    assert all(len(ids) > 60 for ids in prompts)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, params)
    tokens, most_held = {}, 0
    manager = engine.engine_core.block_manager
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[int(output.request_id)] = output.outputs[0].token_ids
        most_held = max(most_held, manager.num_blocks - manager.num_free_blocks)
    engine.shutdown()
    for i, ids in enumerate(prompts):
        assert tokens[i] == hf_greedy(path, ids, 24)
    assert (totals.preemptions == 0) == releases, totals.preemptions
    assert (most_held < 4 * 13) if releases else most_held == 24


def test_phi3_longrope_matches_transformers(model_factory, hf_greedy):
    """Within the original length the short factors and the attention factor give transformers'
    tokens; from it on each position's rotation uses the long factors, as transformers' rotary
    module does. (At the switch transformers' Phi-3 recomputes its whole KV cache with the long
    factors; a paged engine keeps the keys it has, as vLLM does, so tokens past the switch are
    not compared.)"""
    import torch
    from infernetes.kernels.rope import build_cos_sin_cache
    from infernetes.runtime.model_executor.layers.rotary import rope_from_config
    from transformers import AutoModelForCausalLM

    path = model_factory(
        "Phi3ForCausalLM",
        original_max_position_embeddings=32,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [2.0, 4.0, 8.0, 16.0],
            "original_max_position_embeddings": 32,
        },
    )
    llm = LLM(path, dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8)
    prompts = [SAMPLE_PROMPTS[0], SAMPLE_PROMPTS[2]]
    assert all(len(llm.get_tokenizer()(p).input_ids) + 20 < 32 for p in prompts)
    _assert_exact(llm, path, hf_greedy, prompts, max_tokens=20)
    hf = AutoModelForCausalLM.from_pretrained(path)
    base, scaling = rope_from_config(hf.config)
    cache = build_cos_sin_cache(8, 64, base, scaling, hf.config.max_position_embeddings)
    for position in (5, 31, 32, 50):
        cos, sin = hf.model.rotary_emb(torch.zeros(1, 1, 8), torch.tensor([[position]]))
        torch.testing.assert_close(cache[position], torch.cat([cos[0, 0, :4], sin[0, 0, :4]]))
