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

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from infernetes import LLM, SamplingParams

PROMPT = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12]
MAX_TOKENS = 8
SMALL = dict(dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = 448.0


# -- writing checkpoints --------------------------------------------------------------------------


def _linear_names(state: dict[str, torch.Tensor]) -> list[str]:
    return [n.removesuffix(".weight") for n in state if n.rsplit(".", 2)[-2] in PROJECTIONS]


def _write(base: str, out: Path, tensors: dict, quant_config: dict | None, legacy: bool = False):
    """A copy of the model in ``base`` with ``tensors`` as its weights and ``quant_config`` in
    its config.json (or, ``legacy``, in an older GPTQ's quantize_config.json)."""
    shutil.copytree(base, out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    if quant_config is not None:
        if legacy:
            (out / "quantize_config.json").write_text(json.dumps(quant_config))
        else:
            config = json.loads((out / "config.json").read_text())
            config["quantization_config"] = quant_config
            (out / "config.json").write_text(json.dumps(config))
    return out


def _pack(values: torch.Tensor, bits: int, axis: int, order=None) -> torch.Tensor:
    """Unsigned ``bits``-bit values packed into int32 along ``axis``; the value at position
    ``order[i]`` of each run of 32 / bits goes to bits ``i * bits`` (default: in order)."""
    pack = 32 // bits
    v = values.numpy().astype(np.uint64)
    v = np.moveaxis(v, axis, -1)
    v = v.reshape(*v.shape[:-1], -1, pack)
    order = list(order or range(pack))
    words = np.zeros(v.shape[:-1], dtype=np.uint64)
    for i in range(pack):
        words |= v[..., order[i]] << np.uint64(i * bits)
    words = np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)
    return torch.from_numpy(np.ascontiguousarray(words))


def _unpack_bitwise(packed: torch.Tensor, bits: int, axis: int, order=None) -> torch.Tensor:
    """The second, independent reading of the packing: word by word, bit by bit."""
    pack = 32 // bits
    order = list(order or range(pack))
    words = np.moveaxis(packed.numpy(), axis, -1)
    out = np.zeros((*words.shape[:-1], words.shape[-1] * pack), dtype=np.int64)
    for index in np.ndindex(words.shape):
        word = int(words[index]) & 0xFFFFFFFF
        for i in range(pack):
            out[(*index[:-1], index[-1] * pack + order[i])] = (word >> (i * bits)) & (2**bits - 1)
    return torch.from_numpy(np.moveaxis(out, -1, axis))


def _int_quantize(w: torch.Tensor, bits: int, g_idx: torch.Tensor, groups: int, sym: bool):
    """``w`` ``[N, K]`` by groups of input features -> (values ``[K, N]``, zeros ``[G, N]``,
    fp16 scales ``[G, N]``, the dequantised ``[N, K]``)."""
    maxq = 2**bits - 1
    scales, zeros = [], []
    for g in range(groups):
        part = w[:, g_idx == g]
        if sym:
            scale = 2 * part.abs().amax(1) / maxq
            zero = torch.full_like(scale, (maxq + 1) // 2)
        else:
            lo, hi = part.amin(1).clamp(max=0), part.amax(1).clamp(min=0)
            scale = (hi - lo) / maxq
            zero = torch.round(-lo / scale)
        scales.append(scale.half())
        zeros.append(zero.long())
    s, z = torch.stack(scales), torch.stack(zeros)
    sf = s.float()[g_idx.long()]  # [K, N]
    zf = z[g_idx.long()]
    values = torch.clamp(torch.round(w.t() / sf) + zf, 0, maxq).long()
    return values, z, s, ((values - zf) * sf).t()


def _state(base: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(base) / "model.safetensors"))


def write_gptq(base, out, bits=4, group=32, desc_act=False, sym=True, legacy=False, seed=0):
    state, dense = _state(base), _state(base)
    gen = torch.Generator().manual_seed(seed)
    for i, name in enumerate(_linear_names(state)):
        w = state.pop(name + ".weight")
        k = w.shape[1]
        g_idx = torch.arange(k, dtype=torch.int32) // group
        if desc_act:
            g_idx = g_idx[torch.randperm(k, generator=gen)].contiguous()
        values, zeros, scales, dense[name + ".weight"] = _int_quantize(
            w, bits, g_idx, k // group, sym
        )
        state[name + ".qweight"] = _pack(values, bits, axis=0)
        state[name + ".qzeros"] = _pack(zeros - 1, bits, axis=1)  # v1 stores zero - 1
        state[name + ".scales"] = scales
        state[name + ".g_idx"] = g_idx
        if i == 0:
            assert torch.equal(_unpack_bitwise(state[name + ".qweight"], bits, 0), values)
            assert torch.equal(_unpack_bitwise(state[name + ".qzeros"], bits, 1), zeros - 1)
    config = {"bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym}
    if not legacy:
        config |= {"quant_method": "gptq", "checkpoint_format": "gptq"}
    return _write(base, out, state, config, legacy), dense


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column each nibble of a word holds, low bits first


def write_awq(base, out, group=32):
    state, dense = _state(base), _state(base)
    for i, name in enumerate(_linear_names(state)):
        w = state.pop(name + ".weight")
        k = w.shape[1]
        g_idx = torch.arange(k, dtype=torch.int32) // group
        values, zeros, scales, dense[name + ".weight"] = _int_quantize(
            w, 4, g_idx, k // group, sym=False
        )
        state[name + ".qweight"] = _pack(values, 4, axis=1, order=AWQ_ORDER)
        state[name + ".qzeros"] = _pack(zeros, 4, axis=1, order=AWQ_ORDER)
        state[name + ".scales"] = scales
        if i == 0:
            unpacked = _unpack_bitwise(state[name + ".qweight"], 4, 1, AWQ_ORDER)
            assert torch.equal(unpacked, values)
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True}
    return _write(base, out, state, config | {"version": "gemm"}), dense


def _fp8(w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, q.float() * scale


def write_fp8_blockwise(base, out, block=(32, 32)):
    state, dense = _state(base), _state(base)
    bn, bk = block
    for name in _linear_names(state):
        w = state[name + ".weight"]
        n, k = w.shape
        blocks = w.reshape(n // bn, bn, k // bk, bk).abs().amax(dim=(1, 3)) / FP8_MAX
        spread = blocks.repeat_interleave(bn, 0).repeat_interleave(bk, 1)
        state[name + ".weight"], dense[name + ".weight"] = _fp8(w, spread)
        state[name + ".weight_scale_inv"] = blocks
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    return _write(base, out, state, config | {"weight_block_size": list(block)}), dense


def write_fp8_static(base, out, per_channel=False, kv_scales=None):
    state, dense = _state(base), _state(base)
    for name in _linear_names(state):
        w = state[name + ".weight"]
        scale = w.abs().amax(1) / FP8_MAX if per_channel else w.abs().amax().reshape(1) / FP8_MAX
        state[name + ".weight"], dense[name + ".weight"] = _fp8(w, scale.reshape(-1, 1))
        state[name + ".weight_scale"] = scale
        state[name + ".input_scale"] = torch.tensor([0.02])
    for layer, (k_scale, v_scale) in (kv_scales or {}).items():
        state[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k_scale)
        state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v_scale)
    config = {"quant_method": "fp8", "activation_scheme": "static"}
    return _write(base, out, state, config), dense


def write_compressed_tensors(base, out, fmt, weights, input_activations=None):
    """Quantise with compressed-tensors' own scheme, parameters and compressor; the dense
    reference is its fake quantisation of each weight."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    args = QuantizationArgs(**weights)
    inputs = QuantizationArgs(**input_activations) if input_activations else None
    scheme = QuantizationScheme(targets=["Linear"], weights=args, input_activations=inputs)
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    dense = _state(base)
    for name, module in model.named_modules():
        if not hasattr(module, "weight_scale"):
            continue
        w = module.weight.data
        n, k = w.shape
        if args.strategy == "group":
            grouped = w.reshape(n, k // args.group_size, args.group_size)
            lo, hi = grouped.amin(-1), grouped.amax(-1)
        elif args.strategy == "channel":
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        else:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        scale, zero = calculate_qparams(lo, hi, args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
        if hasattr(module, "input_scale"):
            module.input_scale.data.fill_(0.05)
        dense[name + ".weight"] = fake_quantize(
            w, module.weight_scale.data, getattr(module, "weight_zero_point", None), args
        )
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    shutil.copytree(base, out)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == fmt
    return out, dense


def write_dense(base, out, dense):
    return _write(base, out, dense, None)


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
