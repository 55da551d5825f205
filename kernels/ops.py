"""The ops the runtime calls. Each runs the Triton kernel or the torch reference, by the attention
backend for the device of its input (`infernetes.kernels.backend`). Shapes and the KV-cache layout
are documented in docs/architecture.md ("Kernels").
"""

from __future__ import annotations

from types import ModuleType

import torch
from infernetes.kernels import backend
from infernetes.kernels.cpu import attention as _cpu_attention
from infernetes.kernels.cpu import elementwise as _cpu_elementwise
from infernetes.kernels.reference import activation as _ref_activation
from infernetes.kernels.reference import attention as _ref_attention
from infernetes.kernels.reference import cache as _ref_cache
from infernetes.kernels.reference import fp8 as _ref_fp8
from infernetes.kernels.reference import norm as _ref_norm
from infernetes.kernels.reference import rotary as _ref_rotary
from infernetes.kernels.reference import wna16 as _ref_wna16
from infernetes.kernels.reference.fp8 import quantize_weight_fp8

__all__ = [
    "fp8_linear",
    "paged_attention",
    "quantize_weight_fp8",
    "rms_norm",
    "rotary_embedding",
    "scaled_fp8_quant",
    "silu_and_mul",
    "store_kv",
    "wna16_linear",
]


def _triton() -> ModuleType:
    # Imported on first use: Triton decides between compiling and interpreting a kernel when the
    # kernel module is imported, so TRITON_INTERPRET must be set by then.
    from infernetes.kernels import triton_backend

    return triton_backend


def _use_triton(x: torch.Tensor) -> bool:
    # Under torch.compile the torch reference is traced instead: inductor fuses it by itself (vLLM
    # turns its own custom ops off under inductor too), and Dynamo cannot trace a kernel launch
    # whose grid depends on the symbolic batch size. Attention runs outside the traced graph.
    return not torch.compiler.is_compiling() and backend.use_triton(x.device)


def _pick(x: torch.Tensor, name: str, reference):
    """The Triton kernel, the CPU path's C kernel (which falls back to the reference by itself),
    or the torch reference on other devices and under torch.compile."""
    if torch.compiler.is_compiling():
        return reference
    if _use_triton(x):
        return getattr(_triton(), name)
    if x.device.type == "cpu":
        return getattr(_cpu_elementwise, name)
    return reference


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write `key`/`value` `[T, Hkv, D]` into the caches at `slot_mapping` (`-1` skips); fp8
    caches store `x / scale`."""
    impl = _triton().store_kv if _use_triton(key) else _ref_cache.store_kv
    impl(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of `query` `[T, H, D]` over the paged cache -> `[T, H, D]`."""
    if _use_triton(query):
        impl = _triton().paged_attention
    elif query.device.type == "cpu":
        impl = _cpu_attention.paged_attention  # the C decode kernel, the reference for the rest
    else:
        impl = _ref_attention.paged_attention
    return impl(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; with `residual`, returns `(norm(x + residual), x + residual)`."""
    return _pick(x, "rms_norm", _ref_norm.rms_norm)(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate `query` `[T, H, D]` and `key` `[T, Hkv, D]`; returns new tensors. The cache comes
    from `infernetes.kernels.rope.build_cos_sin_cache`."""
    return _pick(query, "rotary_embedding", _ref_rotary.rotary_embedding)(
        positions, query, key, cos_sin_cache, is_neox
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`silu(x[..., :d]) * x[..., d:]` with `d = x.shape[-1] // 2`."""
    return _pick(x, "silu_and_mul", _ref_activation.silu_and_mul)(x)


def scaled_fp8_quant(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise to fp8 with `scale`, or a dynamic per-tensor scale; returns `(q, scale)`."""
    impl = _triton().scaled_fp8_quant if _use_triton(x) else _ref_fp8.scaled_fp8_quant
    return impl(x, scale, dtype)


def fp8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ (qweight * weight_scale).T + bias`; `qweight` `[N, K]` fp8, `weight_scale` per-tensor
    (one element) or per-channel (`[N]`)."""
    impl = _triton().fp8_linear if _use_triton(x) else _ref_fp8.fp8_linear
    return impl(x, qweight, weight_scale, bias)


def wna16_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor,
    bits: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W.T + bias` with `W` a 4- or 8-bit packed weight (layout in
    `infernetes.kernels.reference.wna16`): the Triton GEMM unpacks it tile by tile."""
    impl = _triton().wna16_linear if _use_triton(x) else _ref_wna16.wna16_linear
    return impl(x, qweight, scales, zeros, g_idx, bits, bias)
