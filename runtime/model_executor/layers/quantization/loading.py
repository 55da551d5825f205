"""The loader's entry to quantized checkpoints: the tensors go through the method's format on
their way into the model, and layers the GPU kernels take as stored keep that form (kept.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from infernetes.kernels import backend, ops
from infernetes.runtime.model_executor.layers.linear import LinearBase
from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    Weight,
    dequantized_weights,
)
from infernetes.runtime.model_executor.layers.quantization.detect import checkpoint_format
from infernetes.runtime.model_executor.layers.quantization.fp8 import Fp8Format
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
    dummy_pack_linear_layers,
)

logger = logging.getLogger(__name__)


def keeps_stored(device: torch.device) -> bool:
    return backend.use_triton(device)


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
    if kept:
        loaded |= install_kept(model, kept, device, dtype)
    return loaded


def install_kept(
    model: Any, kept: dict[str, KeptWeight], device: torch.device, dtype: torch.dtype
) -> set[str]:
    """Give the layers the stored forms set aside during the stream (kept.py); what no layer
    takes is loaded dense, as an unquantised checkpoint's layer would be. Returns the parameter
    names now loaded."""
    held, taken = keep_linear_layers(model, kept, device, dtype)
    held_experts, taken_experts = keep_moe_experts(model, kept, device, dtype)
    held_tables, taken_tables = keep_embeddings(model, kept, device)
    kind = type(next(iter(kept.values()))).__name__
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
        dummy_pack_linear_layers(model, *layout, device, dtype, seed)
        dummy_pack_moe_experts(model, *layout, device, dtype, seed)
    elif isinstance(fmt, Fp8Format) and fmt.block is None:
        for module in model.modules():
            if isinstance(module, LinearBase):
                qweight, scale = ops.quantize_weight_fp8(module.weight.data, per_channel=True)
                Fp8Weight(qweight, scale).install(module, device, dtype)
