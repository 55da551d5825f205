"""Mixture-of-experts specifics beyond token equality with transformers (in
test_engine_architectures.py and test_engine_parallel.py): online fp8 experts, a bad checkpoint."""

from __future__ import annotations

import pytest
import torch
from infernetes.runtime.model_executor.loader import ModelLoadError

from infernetes import LLM, SamplingParams

SMALL = dict(dtype="float32", max_model_len=64, num_gpu_blocks_override=32, block_size=8)
PROMPT = {"prompt_token_ids": [0, 398, 340, 321, 455, 80, 72]}


def _first_token_logprobs(llm: LLM) -> dict[int, float]:
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    entry = llm.generate(PROMPT, params)[0].outputs[0].logprobs[0]
    return {token: lp.logprob for token, lp in entry.items()}


def _model(llm: LLM) -> torch.nn.Module:
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner.model


def test_fp8_quantization_stores_experts_in_fp8_and_keeps_the_router(model_factory):
    path = model_factory("MixtralForCausalLM")
    exact = _first_token_logprobs(LLM(path, **SMALL))
    llm = LLM(path, quantization="fp8", **SMALL)
    block = _model(llm).model.layers[0].mlp
    assert block.experts.w13_weight.dtype == torch.float8_e4m3fn
    assert block.experts.w2_weight.dtype == torch.float8_e4m3fn
    assert block.experts.w13_scale.shape == (4,)
    assert block.gate.weight.dtype == torch.float32  # routing stays exact
    quantized = _first_token_logprobs(llm)
    best = max(exact, key=exact.__getitem__)
    assert best in quantized
    assert quantized[best] == pytest.approx(exact[best], abs=0.25)  # fp8 everywhere


def test_a_missing_expert_tensor_is_named(model_factory, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    source = model_factory("Qwen3MoeForCausalLM")
    shutil.copytree(source, tmp_path / "m")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    tensors["model.layers.1.mlp.experts.9.up_proj.weight"] = tensors.pop(
        "model.layers.1.mlp.experts.7.up_proj.weight"
    )
    save_file(tensors, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises((ModelLoadError, ValueError), match="expert 9 is outside the model's 8"):
        LLM(str(tmp_path / "m"), **SMALL)
