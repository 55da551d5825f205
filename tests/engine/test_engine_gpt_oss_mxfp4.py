"""gpt-oss's MXFP4 experts: a checkpoint in the published layout (``*_blocks``, ``*_scales``,
``quantization_config.quant_method: mxfp4``) runs through the transformers fallback, its experts
dequantised at load, and gives the greedy tokens transformers gives on the same weights
dequantised by transformers' own MXFP4 unpacker."""

from __future__ import annotations

import json
import shutil

import torch
from infernetes.runtime.model_executor.mxfp4 import E2M1_VALUES, dequantize_mxfp4
from safetensors.torch import load_file, save_file

from infernetes import LLM, SamplingParams

MAGNITUDES = torch.tensor(E2M1_VALUES[:8])


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., K]`` float -> (blocks uint8 ``[..., K/32, 16]``, scales uint8 ``[..., K/32]``)."""
    groups = weight.float().reshape(*weight.shape[:-1], -1, 32)
    amax = groups.abs().amax(-1).clamp(min=2**-100)
    exponent = torch.ceil(torch.log2(amax / 6.0))  # the largest value maps within +-6
    scaled = groups / torch.exp2(exponent)[..., None]
    index = (scaled.abs()[..., None] - MAGNITUDES).abs().argmin(-1)
    nibbles = (index + 8 * (scaled < 0)).to(torch.uint8)
    blocks = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def test_dequantize_matches_transformers_unpacker():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    weight = torch.randn(3, 8, 64)  # [E, out, in]
    blocks, scales = quantize_mxfp4(weight)
    ours = dequantize_mxfp4(blocks, scales, torch.float32)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    torch.testing.assert_close(ours.transpose(-1, -2), theirs, atol=0, rtol=0)
    assert (ours - weight).abs().max() < 0.3 * weight.abs().max()  # it is a quantisation of it


def test_mxfp4_checkpoint_matches_transformers_on_the_dequantised_weights(
    model_factory, hf_greedy, tmp_path
):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    source = model_factory("GptOssForCausalLM")
    quantized, dequantized = tmp_path / "mxfp4", tmp_path / "dequantized"
    shutil.copytree(source, quantized)
    shutil.copytree(source, dequantized)
    tensors = load_file(source + "/model.safetensors")
    packed, plain = {}, dict(tensors)
    for name, tensor in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize_mxfp4(tensor.transpose(-1, -2))  # stored [E, out, in]
            packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
            plain[name] = convert_moe_packed_tensors(blocks, scales, dtype=tensor.dtype)
        else:
            packed[name] = tensor
    assert any(name.endswith("_blocks") for name in packed)
    save_file(packed, quantized / "model.safetensors", metadata={"format": "pt"})
    save_file(plain, dequantized / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (quantized / "config.json").write_text(json.dumps(config))

    llm = LLM(str(quantized), dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    ids = llm.get_tokenizer()("Kubernetes schedules pods").input_ids
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    tokens = llm.generate({"prompt_token_ids": ids}, params)[0].outputs[0].token_ids
    assert tokens == hf_greedy(str(dequantized), ids, 10)


def test_mxfp4_is_read_for_gpt_oss_only(model_factory, tmp_path):
    import pytest

    shutil.copytree(model_factory("LlamaForCausalLM"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mxfp4 checkpoints are read for GptOssForCausalLM only"):
        LLM(str(tmp_path / "m"), dtype="float32", max_model_len=64, num_gpu_blocks_override=16)
