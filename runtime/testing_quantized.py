"""Tiny pre-quantized checkpoints in each published on-disk format, for tests and benchmarks.

Each writer takes a float checkpoint folder (``runtime.testing.make_tiny_model``) and writes a
quantized copy: GPTQ and AWQ packed here to their published layouts (``unpack_bitwise`` reads a
packing back word by word, independently of the loader), compressed-tensors by the
``compressed-tensors`` library itself (a dev dependency), fp8 as Hugging Face stores it. Each
returns ``(folder, dense)``: ``dense`` is the state dict with the dequantised weights, the
reference a float model must reproduce (``write_dense``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = 448.0


# -- writing checkpoints --------------------------------------------------------------------------


def _linear_names(
    state: dict[str, torch.Tensor], projections: tuple[str, ...] = PROJECTIONS
) -> list[str]:
    return [
        n.removesuffix(".weight")
        for n in state
        if n.endswith(".weight") and n.rsplit(".", 2)[-2] in projections
    ]


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
    v = values.numpy().astype(np.int64).astype(np.uint64) & np.uint64(2**bits - 1)
    v = np.moveaxis(v, axis, -1)
    v = v.reshape(*v.shape[:-1], -1, pack)
    order = list(order or range(pack))
    words = np.zeros(v.shape[:-1], dtype=np.uint64)
    for i in range(pack):
        words |= v[..., order[i]] << np.uint64(i * bits)
    words = np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)
    return torch.from_numpy(np.ascontiguousarray(words))


def unpack_bitwise(packed: torch.Tensor, bits: int, axis: int, order=None) -> torch.Tensor:
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


def read_state(base: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(base) / "model.safetensors"))


def write_gptq(
    base,
    out,
    bits=4,
    group=32,
    desc_act=False,
    sym=True,
    legacy=False,
    v2=False,
    seed=0,
    projections=PROJECTIONS,
):
    """GPTQ; ``v2``: GPTQModel's "gptq_v2" checkpoint format (zero points stored as they are);
    ``projections``: the linear layers quantized, by their last name."""
    state, dense = read_state(base), read_state(base)
    gen = torch.Generator().manual_seed(seed)
    orders: dict[str, torch.Tensor] = {}
    for i, name in enumerate(_linear_names(state, projections)):
        w = state.pop(name + ".weight")
        k = w.shape[1]
        g_idx = torch.arange(k, dtype=torch.int32) // group
        if desc_act:  # one activation order per input, as GPTQ's is (q/k/v share theirs)
            key = name.replace("k_proj", "q_proj").replace("v_proj", "q_proj")
            order = orders.setdefault(
                key.replace("up_proj", "gate_proj"), torch.randperm(k, generator=gen)
            )
            g_idx = g_idx[order].contiguous()
        values, zeros, scales, dense[name + ".weight"] = _int_quantize(
            w, bits, g_idx, k // group, sym
        )
        state[name + ".qweight"] = _pack(values, bits, axis=0)
        stored_zeros = zeros if v2 else zeros - 1  # v1 stores zero - 1
        state[name + ".qzeros"] = _pack(stored_zeros, bits, axis=1)
        state[name + ".scales"] = scales
        state[name + ".g_idx"] = g_idx
        if i == 0:
            assert torch.equal(unpack_bitwise(state[name + ".qweight"], bits, 0), values)
            assert torch.equal(unpack_bitwise(state[name + ".qzeros"], bits, 1), stored_zeros)
    config = {"bits": bits, "group_size": group, "desc_act": desc_act, "sym": sym}
    if not legacy:
        config |= {"quant_method": "gptq", "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    return _write(base, out, state, config, legacy), dense


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column each nibble of a word holds, low bits first


def write_awq(base, out, group=32, projections=PROJECTIONS):
    state, dense = read_state(base), read_state(base)
    for i, name in enumerate(_linear_names(state, projections)):
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
            unpacked = unpack_bitwise(state[name + ".qweight"], 4, 1, AWQ_ORDER)
            assert torch.equal(unpacked, values)
            assert torch.equal(unpack_bitwise(state[name + ".qzeros"], 4, 1, AWQ_ORDER), zeros)
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True}
    return _write(base, out, state, config | {"version": "gemm"}), dense


def _fp8(w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, q.float() * scale


def write_fp8_blockwise(base, out, block=(32, 32)):
    state, dense = read_state(base), read_state(base)
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
    state, dense = read_state(base), read_state(base)
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
    dense = read_state(base)
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
        elif args.strategy == "block":
            bn, bk = args.block_structure
            blocks = w.reshape(n // bn, bn, k // bk, bk)
            lo, hi = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
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
