"""The loader's entry to quantized checkpoints: the tensors go through the method's format on
their way into the model, and layers the device's kernels take as stored keep that form
(kept.py): on the Triton kernels' devices every kept form, on the CPU the weight-only integer
layers as `GroupQuantWeight` (its C kernels read them packed; the rest loads dense)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from infernetes.kernels import backend, ops
from infernetes.kernels.cpu import native
from infernetes.runtime.model_executor.layers.linear import LinearBase
from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    Weight,
    dequantized_weights,
)
from infernetes.runtime.model_executor.layers.quantization.detect import checkpoint_format
from infernetes.runtime.model_executor.layers.quantization.fp8 import Fp8Format
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight
from infernetes.runtime.model_executor.layers.quantization.kept import (
    Fp8Weight,
    KeptWeight,
    keep_embeddings,
    keep_linear_layers,
)
from infernetes.runtime.model_executor.layers.quantization.kept_experts import (
    dummy_pack_moe_experts,
    keep_moe_experts,
)
from infernetes.runtime.model_executor.layers.quantization.kv_scales import attach_kv_scales
from infernetes.runtime.model_executor.layers.quantization.packed_int import (
    PackedInt,
    dummy_pack_linear_layers,
)

logger = logging.getLogger(__name__)


def keeps_stored(device: torch.device) -> bool:
    """The Triton kernels' devices, and the CPU unless its C kernels are off."""
    return backend.use_triton(device) or (device.type == "cpu" and native.enabled())


def device_form(weight: KeptWeight, device: torch.device) -> KeptWeight | None:
    """`weight` in the form the device's kernels read, or None when it loads dense there."""
    if backend.use_triton(device):
        return weight
    return GroupQuantWeight.from_packed_int(weight) if isinstance(weight, PackedInt) else None


def load_quantized(
    model: Any,
    weights: Iterable[tuple[str, Weight]],
    config: dict[str, Any] | None,
    dtype: torch.dtype,
    device: torch.device,
) -> set[str]:
    """``model.load_weights`` over the checkpoint's tensors as its method (``config``, None for
    an unquantised checkpoint) reads them; the attention layers get any KV-cache scales.
    Raises CheckpointError or ConfigError naming what does not fit."""
    fmt = checkpoint_format(config) if config is not None else None
    kv_scales: dict[str, dict[str, float]] = {}
    kept: dict[str, KeptWeight] | None = {} if keeps_stored(device) else None
    loaded = model.load_weights(dequantized_weights(weights, fmt, dtype, kv_scales, kept))
    if kv_scales:
        logger.info("KV-cache scales for %d attention layers", attach_kv_scales(model, kv_scales))
    forms: dict[str, KeptWeight] = {}
    for prefix, weight in list((kept or {}).items()):
        form = device_form(weight, device)
        if form is not None and kept is not None:  # replaces the stored form: never held twice
            forms[prefix] = kept[prefix] = form
    if kept:
        loaded |= install_kept(model, kept, device, dtype, forms)
    return loaded


def install_kept(
    model: Any,
    kept: dict[str, KeptWeight],
    device: torch.device,
    dtype: torch.dtype,
    forms: dict[str, KeptWeight] | None = None,
) -> set[str]:
    """Give the layers the stored forms set aside during the stream (kept.py), as ``forms``
    has them in the device's form (default: as stored); what no layer takes is loaded dense, as
    an unquantised checkpoint's layer would be. Returns the parameter names now loaded."""
    forms = kept if forms is None else forms
    held, taken = keep_linear_layers(model, forms, device, dtype)
    held_experts, taken_experts = (
        keep_moe_experts(model, forms, device, dtype)
        if backend.use_triton(device)
        else (set(), set())  # the CPU has no packed MoE kernel: experts load dense
    )
    held_tables, taken_tables = keep_embeddings(model, forms, device)
    kind = type(next(iter(forms.values()), next(iter(kept.values())))).__name__
    logger.info(
        "Linear layers keep their checkpoint's stored weights (%s, %d tensors; %d MoE layers; "
        "%d embedding tables)",
        kind,
        len(held),
        len(held_experts) // 2,
        len(taken_tables),
    )
    taken |= taken_experts | taken_tables
    rest = [(prefix, layer) for prefix, layer in kept.items() if prefix not in taken]
    return (
        held
        | held_experts
        | held_tables
        | model.load_weights((p + ".weight", w.dequantize(dtype)) for p, w in rest)
    )


def dummy_quantized(
    model: Any, config: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int
) -> None:
    """``--load-format dummy`` of a quantized model where the stored forms are kept: random
    packed int weights, or the dummy weights in fp8 with a scale per output (benchmarks)."""
    if not keeps_stored(device):
        return
    fmt = checkpoint_format(config)
    layout = fmt.dummy_layout()
    if layout is not None:
        dummy_pack_linear_layers(model, *layout, lambda w: device_form(w, device), dtype, seed)
        if backend.use_triton(device):
            dummy_pack_moe_experts(model, *layout, device, dtype, seed)
    elif isinstance(fmt, Fp8Format) and fmt.block is None and backend.use_triton(device):
        for module in model.modules():
            if isinstance(module, LinearBase):
                qweight, scale = ops.quantize_weight_fp8(module.weight.data, per_channel=True)
                Fp8Weight(qweight, scale).install(module, device, dtype)
