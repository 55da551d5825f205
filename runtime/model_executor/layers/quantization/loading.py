"""The loader's entry to quantized checkpoints: the tensors go through the method's format on
their way into the model, and weight-only integer layers go back to their packed form where the
Triton GEMM runs (one rank: ``--attention-backend TRITON_ATTN``, the GPU default)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from infernetes.kernels import backend
from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    Weight,
    dequantized_weights,
)
from infernetes.runtime.model_executor.layers.quantization.detect import checkpoint_format
from infernetes.runtime.model_executor.layers.quantization.kv_scales import attach_kv_scales
from infernetes.runtime.model_executor.layers.quantization.packed_int import (
    PackedInt,
    dummy_pack_linear_layers,
    pack_linear_layers,
)
from infernetes.runtime.model_executor.parallel import tp_size

logger = logging.getLogger(__name__)


def keeps_packed(device: torch.device) -> bool:
    return backend.use_triton(device) and tp_size() == 1


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
    packed: dict[str, PackedInt] | None = {} if keeps_packed(device) else None
    loaded = model.load_weights(dequantized_weights(weights, fmt, dtype, kv_scales, packed))
    if kv_scales:
        logger.info("KV-cache scales for %d attention layers", attach_kv_scales(model, kv_scales))
    if packed:
        count = pack_linear_layers(model, packed, device, dtype)
        bits = next(iter(packed.values())).bits
        logger.info("%d linear layers run the packed int%d GEMM", count, bits)
    return loaded


def dummy_quantized(
    model: Any, config: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int
) -> None:
    """``--load-format dummy`` of a weight-only integer model: random packed weights."""
    layout = checkpoint_format(config).dummy_layout()
    if layout is not None and keeps_packed(device):
        dummy_pack_linear_layers(model, *layout, device, dtype, seed)
