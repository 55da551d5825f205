"""Pre-quantized checkpoints in each published on-disk format, written here from a tiny random
Llama: GPTQ and AWQ packed by hand to their layouts (each packing checked by a bit-by-bit
unpacker), compressed-tensors by the ``compressed-tensors`` library itself, fp8 as Hugging Face
stores it. The engine must produce transformers' greedy tokens (and logprobs within float
tolerance) on the same model with the dequantised weights, a checkpoint whose tensors do not match
its declared method must fail naming the tensor and the method, and ``--quantization`` must agree
with the checkpoint."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from infernetes.runtime.testing_quantized import (
    write_awq,
    write_compressed_tensors,
    write_dense,
    write_fp8_blockwise,
    write_fp8_static,
    write_gptq,
)
from safetensors.torch import load_file, save_file

from infernetes import LLM, SamplingParams

PROMPT = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12]
MAX_TOKENS = 8
SMALL = dict(dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8)


# -- comparing with transformers ------------------------------------------------------------------


def _hf_logprobs(path: Path, tokens: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + tokens])
    with torch.inference_mode():
        logprobs = model(ids).logits[0].log_softmax(-1)
    return [float(logprobs[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]


def assert_matches_transformers(quantized: Path, dense_dir: Path, hf_greedy, **engine) -> LLM:
    llm = LLM(str(quantized), **{**SMALL, **engine})
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    [output] = llm.generate({"prompt_token_ids": PROMPT}, params)
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    assert tokens == hf_greedy(dense_dir, PROMPT, MAX_TOKENS)
    logprobs = [entry[t].logprob for t, entry in zip(tokens, completion.logprobs, strict=True)]
    assert logprobs == pytest.approx(_hf_logprobs(dense_dir, tokens), abs=1e-3)
    return llm


def _check(tmp_path, base, writer, hf_greedy, **options):
    quantized, dense = writer(base, tmp_path / "quantized", **options)
    return assert_matches_transformers(
        quantized, write_dense(base, tmp_path / "dense", dense), hf_greedy
    )


@pytest.fixture(scope="module")
def base(model_factory):
    return model_factory("LlamaForCausalLM")


@pytest.fixture(scope="module")
def wide_base(model_factory):
    """Every layer's input features a multiple of 128 (group size 128)."""
    return model_factory("LlamaForCausalLM", hidden_size=128, intermediate_size=256)


# -- each format ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(bits=4, group=32, desc_act=False, sym=True),
        dict(bits=4, group=64, desc_act=True, sym=False),
        dict(bits=8, group=32, desc_act=True, sym=True),
        dict(bits=8, group=64, desc_act=False, sym=False),
        dict(bits=4, group=32, legacy=True),  # quantize_config.json, no quant_method
        dict(bits=4, group=32, sym=False, v2=True),  # zero points stored as they are
    ],
)
def test_gptq(tmp_path, base, hf_greedy, options):
    _check(tmp_path, base, write_gptq, hf_greedy, **options)


def test_gptq_group_128_and_marlin_name(tmp_path, wide_base, hf_greedy):
    quantized, dense = write_gptq(wide_base, tmp_path / "q", group=128, desc_act=True)
    dense_dir = write_dense(wide_base, tmp_path / "dense", dense)
    assert_matches_transformers(quantized, dense_dir, hf_greedy, quantization="gptq_marlin")


@pytest.mark.parametrize("group", [32, 64])
def test_awq(tmp_path, base, hf_greedy, group):
    _check(tmp_path, base, write_awq, hf_greedy, group=group)


@pytest.mark.parametrize("block", [(32, 32), (32, 64)])
def test_fp8_blockwise(tmp_path, base, hf_greedy, block):
    _check(tmp_path, base, write_fp8_blockwise, hf_greedy, block=block)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_static(tmp_path, base, hf_greedy, per_channel):
    _check(tmp_path, base, write_fp8_static, hf_greedy, per_channel=per_channel)


PACKED = [
    dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32),
    dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=64),
    dict(num_bits=8, type="int", symmetric=True, strategy="group", group_size=32),
    dict(num_bits=8, type="int", symmetric=False, strategy="group", group_size=64),
    dict(num_bits=4, type="int", symmetric=True, strategy="channel"),
]


@pytest.mark.parametrize("weights", PACKED)
def test_compressed_tensors_pack_quantized(tmp_path, base, hf_greedy, weights):
    _check(
        tmp_path, base, write_compressed_tensors, hf_greedy, fmt="pack-quantized", weights=weights
    )


def test_compressed_tensors_group_128(tmp_path, wide_base, hf_greedy):
    weights = dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=128)
    _check(
        tmp_path,
        wide_base,
        write_compressed_tensors,
        hf_greedy,
        fmt="pack-quantized",
        weights=weights,
    )


@pytest.mark.parametrize(
    "weights,inputs",
    [
        (
            dict(num_bits=8, type="float", symmetric=True, strategy="tensor"),
            dict(num_bits=8, type="float", symmetric=True, strategy="tensor", dynamic=False),
        ),
        (
            dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
            dict(num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True),
        ),
        (  # llm-compressor's FP8_BLOCK scheme, at a tiny model's block and group sizes
            dict(
                num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[16, 32]
            ),
            dict(
                num_bits=8,
                type="float",
                symmetric=True,
                strategy="group",
                group_size=32,
                dynamic=True,
            ),
        ),
    ],
)
def test_compressed_tensors_fp8(tmp_path, base, hf_greedy, weights, inputs):
    _check(
        tmp_path,
        base,
        write_compressed_tensors,
        hf_greedy,
        fmt="float-quantized",
        weights=weights,
        input_activations=inputs,
    )


def test_compressed_tensors_int8(tmp_path, base, hf_greedy):
    weights = dict(num_bits=8, type="int", symmetric=True, strategy="channel")
    inputs = dict(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    _check(
        tmp_path,
        base,
        write_compressed_tensors,
        hf_greedy,
        fmt="int-quantized",
        weights=weights,
        input_activations=inputs,
    )


# -- KV-cache scales ------------------------------------------------------------------------------


def test_checkpoint_kv_scales_feed_an_fp8_cache(tmp_path, base, caplog):
    scales = {0: (0.011, 0.013), 1: (0.017, 0.019)}
    quantized, _ = write_fp8_static(base, tmp_path / "scaled", kv_scales=scales)
    llm = LLM(str(quantized), kv_cache_dtype="fp8", **SMALL)
    runner = llm.llm_engine.engine_core.executor.driver_worker.model_runner
    got = [s for a in runner.attention_layers for s in (float(a.k_scale), float(a.v_scale))]
    assert got == pytest.approx([*scales[0], *scales[1]])
    [output] = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=4))
    assert len(output.outputs[0].token_ids) == 4
    # Without an fp8 cache the scales are read and left unused; without scales, 1.0 and a warning.
    assert len(LLM(str(quantized), **SMALL).generate({"prompt_token_ids": PROMPT})) == 1
    plain, _ = write_fp8_static(base, tmp_path / "unscaled")
    with caplog.at_level(logging.WARNING):
        llm = LLM(str(plain), kv_cache_dtype="fp8", **SMALL)
    runner = llm.llm_engine.engine_core.executor.driver_worker.model_runner
    assert [float(a.k_scale) for a in runner.attention_layers] == [1.0, 1.0]
    assert "carries no k_scale/v_scale for 2 attention layers" in caplog.text


# -- what does not fit ----------------------------------------------------------------------------


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _set_quant_config(path: Path, quant_config: dict) -> None:
    config = _config(path)
    config["quantization_config"] = quant_config
    (path / "config.json").write_text(json.dumps(config))


def test_tensors_that_do_not_fit_the_declared_method(tmp_path, base):
    gptq, _ = write_gptq(base, tmp_path / "gptq")
    # compressed-tensors' config over GPTQ's tensors
    _set_quant_config(
        gptq,
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "strategy": "group"}}
            },
        },
    )
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.0\..*\.(qweight|qzeros|scales|g_idx)' "
        r"is not part of the compressed-tensors format",
    ):
        LLM(str(gptq), **SMALL)
    # GPTQ's tensors declared 8-bit: the packed shapes do not fit
    _set_quant_config(gptq, {"quant_method": "gptq", "bits": 8, "group_size": 32})
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.\d\..*' has shape .* \(quantization "
        r"method gptq \(8-bit, group size 32\)\)",
    ):
        LLM(str(gptq), **SMALL)
    # block-wise fp8 declared over a plain float checkpoint
    plain = shutil.copytree(base, tmp_path / "plain")
    _set_quant_config(plain, {"quant_method": "fp8", "weight_block_size": [32, 32]})
    with pytest.raises(
        ValueError, match=r"declares quantization method fp8 .* none of its tensors"
    ):
        LLM(str(plain), **SMALL)
    # an fp8 weight whose scale is missing
    fp8, _ = write_fp8_static(base, tmp_path / "fp8")
    state = load_file(str(fp8 / "model.safetensors"))
    del state["model.layers.1.mlp.down_proj.weight_scale"]
    save_file(state, str(fp8 / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.1\.mlp\.down_proj\.weight' is quantized "
        r"but the layer has no scale \(weight_scale\) \(quantization method fp8",
    ):
        LLM(str(fp8), **SMALL)


def test_quantization_flag_must_agree_with_the_checkpoint(tmp_path, base):
    gptq, _ = write_gptq(base, tmp_path / "gptq")
    with pytest.raises(ValueError, match=r"--quantization awq contradicts the checkpoint .* gptq"):
        LLM(str(gptq), quantization="awq", **SMALL)
    with pytest.raises(ValueError, match="--quantization fp8 contradicts"):
        LLM(str(gptq), quantization="fp8", **SMALL)
    with pytest.raises(ValueError, match="needs a checkpoint quantized with gptq"):
        LLM(base, quantization="gptq_marlin", **SMALL)
    _set_quant_config(gptq, {"quant_method": "bitsandbytes"})
    with pytest.raises(ValueError, match=r"'bitsandbytes' .* not supported; supported: awq"):
        LLM(str(gptq), **SMALL)
    _set_quant_config(gptq, {"quant_method": "gptq", "bits": 3})
    with pytest.raises(ValueError, match="supports \\(4, 8\\) bits, not 3"):
        LLM(str(gptq), **SMALL)
    _set_quant_config(gptq, {"quant_method": "awq", "version": "gemv"})
    with pytest.raises(ValueError, match="only the GEMM packing"):
        LLM(str(gptq), **SMALL)


# -- tensor parallel ------------------------------------------------------------------------------


@pytest.mark.slow  # a worker process per rank
@pytest.mark.parametrize("writer", ["gptq", "compressed-tensors"])
def test_tensor_parallel_quantized(tmp_path, base, hf_greedy, writer):
    """Each rank dequantises the layers and keeps its shard, through the layers' own loaders."""
    from infernetes.runtime.engine.llm_engine import LLMEngine

    from infernetes.schema.config import build_config

    if writer == "gptq":
        quantized, dense = write_gptq(base, tmp_path / "q", desc_act=True, sym=False)
    else:
        weights = dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32)
        quantized, dense = write_compressed_tensors(
            base, tmp_path / "q", fmt="pack-quantized", weights=weights
        )
    dense_dir = write_dense(base, tmp_path / "dense", dense)
    config = build_config(str(quantized), device="cpu", tensor_parallel_size=2, **SMALL)
    engine = LLMEngine(config, stat_loggers=[])
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        engine.add_request("0", PROMPT, params)
        tokens = None
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    tokens = list(output.outputs[0].token_ids)
    finally:
        engine.shutdown()
    assert tokens == hf_greedy(dense_dir, PROMPT, MAX_TOKENS)


def test_compressed_tensors_groups_by_name_win_over_the_class_target():
    from infernetes.runtime.model_executor.layers.quantization.compressed_tensors import (
        CompressedTensorsFormat,
    )

    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}
    fmt = CompressedTensorsFormat(
        {
            "format": "pack-quantized",
            "config_groups": {
                "all": {"targets": ["Linear"], "weights": weights},
                "down": {"targets": ["re:.*down_proj$"], "weights": {**weights, "num_bits": 8}},
            },
            "ignore": ["lm_head"],
        }
    )
    assert fmt.scheme("model.layers.0.mlp.down_proj").num_bits == 8
    assert fmt.scheme("model.layers.0.mlp.up_proj").num_bits == 4
    with pytest.raises(
        ValueError, match=r"'lm_head\.weight_scale' is quantized but the layer is in"
    ):
        fmt.scheme("lm_head")
