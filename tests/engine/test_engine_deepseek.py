"""DeepSeek-V2/V3: multi-head latent attention over a latent KV cache and DeepSeek's routing.

Tiny random models of each variant (V2-Lite's uncompressed queries, V2's compressed ones with
group-limited routing, V3's grouped sigmoid routing with a correction bias, yarn with mscale, the
non-interleaved rope layout) generate what transformers generates, token for token, under chunked
prefill and prefix-cache hits, with logprobs close; the cache holds one latent per token."""

from __future__ import annotations

import pytest
import torch
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams

ENGINE = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8)
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "rope_theta": 10000.0,
}
VARIANTS = {
    "v2-lite": ("DeepseekV2ForCausalLM", {}),
    "v2-grouped": (
        "DeepseekV2ForCausalLM",
        dict(q_lora_rank=24, topk_method="group_limited_greedy", n_group=4, topk_group=2),
    ),
    "v2-yarn": (
        "DeepseekV2ForCausalLM",
        dict(rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 0.5}),
    ),
    "v3": ("DeepseekV3ForCausalLM", {}),
    # more query heads than the latent attention takes in one call (LatentAttention.heads_per_call)
    "v3-40-heads": ("DeepseekV3ForCausalLM", dict(num_attention_heads=40, num_key_value_heads=40)),
    "v3-yarn-halves": (
        "DeepseekV3ForCausalLM",
        dict(
            rope_interleave=False,
            rope_parameters={**YARN, "mscale": 0.707, "mscale_all_dim": 0.707},
        ),
    ),
}


def _model(llm: LLM) -> torch.nn.Module:
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner


def _hf_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    from infernetes.runtime.testing import _hf_causal_lm

    with torch.inference_mode():
        logits = _hf_causal_lm(path)(torch.tensor([ids])).logits[0, -1]
    return logits.float().log_softmax(-1)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_deepseek_matches_transformers(model_factory, hf_greedy, variant):
    architecture, overrides = VARIANTS[variant]
    path = model_factory(architecture, **overrides)
    llm = LLM(path, **ENGINE)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
    for prompt, output in zip(SAMPLE_PROMPTS, llm.generate(SAMPLE_PROMPTS, params), strict=True):
        ids = tokenizer(prompt).input_ids
        completion = output.outputs[0]
        assert completion.token_ids == hf_greedy(path, ids, 10), prompt
        expected = _hf_logprobs(path, ids)
        for token, logprob in completion.logprobs[0].items():
            assert logprob.logprob == pytest.approx(expected[token].item(), abs=1e-4)
    # chunked prefill and a prefix-cache hit stay exact
    chunked = LLM(path, **ENGINE, max_num_batched_tokens=8)
    prompts = [SAMPLE_PROMPTS[1], SAMPLE_PROMPTS[1] + " again"]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outputs = chunked.generate(prompts, greedy)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].token_ids == hf_greedy(path, tokenizer(prompt).input_ids, 10)
    assert chunked.generate(prompts[1], greedy)[0].num_cached_tokens > 0


def test_the_cache_holds_one_latent_per_token(model_factory):
    path = model_factory("DeepseekV3ForCausalLM")
    runner = _model(LLM(path, **ENGINE))
    latent = 32 + 8  # kv_lora_rank + qk_rope_head_dim of the tiny config
    for layer in runner.attention_layers:
        assert tuple(layer.k_cache.shape) == (64, 8, 1, latent)
        assert layer.v_cache is layer.k_cache  # the values are the latent's first entries
    # two layers, one latent of float32 per token: what the KV-cache sizing counts
    assert runner.bytes_per_block == 2 * latent * 4 * 8


def test_routing_matches_transformers_routers():
    """The routing functions against transformers' own routers on random logits."""
    import transformers
    from infernetes.runtime.model_executor.layers import deepseek_routing as routing

    torch.manual_seed(0)
    hidden = torch.randn(16, 64)
    common = dict(
        hidden_size=64,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    v3 = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter(
        transformers.DeepseekV3Config(**common, norm_topk_prob=True)
    )
    v3.weight.data.normal_()
    v3.e_score_correction_bias.uniform_(0, 0.5)
    logits, hf_weights, hf_ids = v3(hidden)
    weights, ids = routing.sigmoid_biased_group_topk(
        logits, v3.e_score_correction_bias, 4, 2.5, 4, 2, True
    )
    _assert_same_routes(hf_weights, hf_ids, weights, ids)
    for method in ("greedy", "group_limited_greedy"):
        v2 = transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2TopkRouter(
            transformers.DeepseekV2Config(**common, topk_method=method)
        )
        v2.weight.data.normal_()
        logits, hf_weights, hf_ids = v2(hidden)
        grouped = method == "group_limited_greedy"
        weights, ids = routing.softmax_topk(
            logits, 4, 2.5, 4 if grouped else None, 2 if grouped else None
        )
        _assert_same_routes(hf_weights, hf_ids, weights, ids)


def _assert_same_routes(hf_weights, hf_ids, weights, ids) -> None:
    order, hf_order = ids.long().sort(-1), hf_ids.long().sort(-1)
    assert torch.equal(order.values, hf_order.values)
    assert torch.allclose(weights.gather(1, order.indices), hf_weights.gather(1, hf_order.indices))


def test_an_unknown_topk_method_is_named(model_factory):
    path = model_factory("DeepseekV2ForCausalLM", topk_method="random")
    with pytest.raises(ValueError, match="topk_method 'random' is not supported"):
        LLM(path, **ENGINE)


def test_fp8_and_bf16_keep_the_absorbed_weights_and_the_router_exact(model_factory):
    """``kv_b_proj`` is read as W_UK/W_UV and the router scores in float32: under
    ``--quantization fp8`` (and bf16's packed CPU weights) both stay plain tensors."""
    path = model_factory("DeepseekV3ForCausalLM")
    prompt = {"prompt_token_ids": [0, 398, 340, 321, 455, 80, 72]}
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    small = dict(max_model_len=64, num_gpu_blocks_override=32, block_size=8)

    def first(llm: LLM) -> dict[int, float]:
        entry = llm.generate(prompt, params)[0].outputs[0].logprobs[0]
        return {token: lp.logprob for token, lp in entry.items()}

    exact = first(LLM(path, dtype="float32", **small))
    best = max(exact, key=exact.__getitem__)
    quantized_llm = LLM(path, dtype="float32", quantization="fp8", **small)
    layer = _model(quantized_llm).model.model.layers[1]
    assert layer.self_attn.q_b_proj.weight.dtype == torch.float8_e4m3fn
    assert layer.self_attn.kv_b_proj.weight.dtype == torch.float32
    assert layer.mlp.gate.weight.dtype == torch.float32
    for llm in (quantized_llm, LLM(path, dtype="bfloat16", **small)):
        approximate = first(llm)
        assert best in approximate
        assert approximate[best] == pytest.approx(exact[best], abs=0.25)


def test_lora_on_the_latent_attention_matches_peft(model_factory, tmp_path):
    """LoRA on MLA's projections equals transformers + peft (peft writes
    ``target_parameters: []`` for these MoE models: nothing targeted); ``kv_b_proj``, read as the
    absorbed W_UK/W_UV, is refused by name."""
    from infernetes.runtime.lora.adapter import LoRAAdapterError
    from infernetes.runtime.lora.request import LoRARequest
    from infernetes.runtime.testing import hf_peft_greedy_tokens, make_tiny_lora

    base = model_factory("DeepseekV3ForCausalLM")
    targets = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")
    adapter = make_tiny_lora(base, tmp_path / "mla", target_modules=targets)
    llm = LLM(base, **ENGINE, enable_lora=True, max_lora_rank=8)
    ids = [0, 398, 340, 321, 455, 80, 72]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    output = llm.generate(
        {"prompt_token_ids": ids}, params, lora_request=LoRARequest("mla", 1, str(adapter))
    )
    assert output[0].outputs[0].token_ids == hf_peft_greedy_tokens(base, adapter, ids, 8)
    absorbed = make_tiny_lora(base, tmp_path / "kv_b", target_modules=("kv_b_proj",))
    with pytest.raises(LoRAAdapterError, match="kv_b_proj', which this model does not serve"):
        llm.generate(
            {"prompt_token_ids": ids}, params, lora_request=LoRARequest("kv", 2, str(absorbed))
        )
