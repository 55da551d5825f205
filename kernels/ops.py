"""The ops the runtime calls. Each runs the Triton kernel or the torch reference, by the attention
backend for the device of its input (`infernetes.kernels.backend`). Shapes and the KV-cache layout
are documented in docs/architecture.md ("Kernels").
"""

from __future__ import annotations

from types import ModuleType

import torch
from infernetes.kernels import backend
from infernetes.kernels.cpu import attention as _cpu_attention
from infernetes.kernels.cpu import cache as _cpu_cache
from infernetes.kernels.cpu import elementwise as _cpu_elementwise
from infernetes.kernels.cpu import group_quant as _cpu_group_quant
from infernetes.kernels.reference import activation as _ref_activation
from infernetes.kernels.reference import attention as _ref_attention
from infernetes.kernels.reference import cache as _ref_cache
from infernetes.kernels.reference import fp8 as _ref_fp8
from infernetes.kernels.reference import fp8_block as _ref_fp8_block
from infernetes.kernels.reference import group_quant as _ref_group_quant
from infernetes.kernels.reference import lora as _ref_lora
from infernetes.kernels.reference import moe as _ref_moe
from infernetes.kernels.reference import norm as _ref_norm
from infernetes.kernels.reference import rotary as _ref_rotary
from infernetes.kernels.reference import wna16 as _ref_wna16
from infernetes.kernels.reference.fp8 import quantize_weight_fp8

__all__ = [
    "attend_within_images",
    "block_fp8_linear",
    "fp8_linear",
    "fused_moe",
    "fused_moe_wna16",
    "group_quant_linear",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "quantize_weight_fp8",
    "rms_norm",
    "rotary_embedding",
    "scaled_fp8_quant",
    "select_experts",
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
    if _use_triton(key):
        impl = _triton().store_kv
    elif key.device.type == "cpu":
        impl = _cpu_cache.store_kv  # the C kernel, the reference for what it does not handle
    else:
        impl = _ref_cache.store_kv
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
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of `query` `[T, H, D]` over the paged cache -> `[T, H, D]`. With
    `sliding_window` a query sees only the last `sliding_window` positions (itself included);
    with `softcap` scores are soft-capped, `softcap * tanh(score / softcap)`; `sinks` `[H]` are a
    logit per head that joins each softmax's denominator without a value (attention sinks)."""
    if _use_triton(query):
        impl = _triton().paged_attention
    elif query.device.type == "cpu":
        impl = _cpu_attention.paged_attention  # the C decode kernel, the reference for the rest
    else:
        impl = _ref_attention.paged_attention
    return impl(
        query,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        scale,
        k_scale,
        v_scale,
        sliding_window=sliding_window,
        softcap=softcap,
        sinks=sinks,
    )


def attend_within_images(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    spans: list[tuple[int, int, int, int, int]],
    scale: float,
    out: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Rewrite the rows of `out` (`paged_attention`'s) of image tokens that attend to their
    whole image, later tokens too (Gemma 3): each span `(seq, first_row, end_row,
    first_position, image_end)` sees every key before `image_end`, within `sliding_window` of
    the query when given. The torch reference on every device: a few hundred rows per image,
    only in the steps that reach one."""
    _ref_attention.attend_within_images(
        query,
        k_cache,
        v_cache,
        block_tables,
        spans,
        scale,
        out,
        k_scale,
        v_scale,
        sliding_window,
        softcap,
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


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing: the `top_k` experts of each token, `(weights [T, k] float32, ids [T, k]
    int32)`, the weights renormalised to sum to one when `renormalize`."""
    return _ref_moe.select_experts(router_logits, top_k, renormalize)


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The routed experts of `hidden` `[T, H]` summed by their weights -> `[T, H]`; `w13`
    `[E, 2I, H]` (gate then up), `w2` `[E, H, I]`, fp8 with scales `[E]` or `[E, N]`, or per
    `block` `[E, ceil(N / bn), ceil(K / bk)]` (see `infernetes.kernels.reference.moe`)."""
    impl = _triton().fused_moe if _use_triton(hidden) else _ref_moe.fused_moe
    return impl(hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block)


def fused_moe_wna16(
    hidden: torch.Tensor,
    w13: _ref_wna16.PackedExperts,
    w2: _ref_wna16.PackedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """`fused_moe` with the experts' weights 4- or 8-bit packed (`w13` `[E, H * bits / 32, 2I]`,
    `w2` `[E, I * bits / 32, H]`; `infernetes.kernels.reference.wna16.PackedExperts`): the
    Triton GEMMs unpack them tile by tile."""
    _ref_wna16.check_packed_moe_shapes(hidden, w13, w2, topk_weights, topk_ids)
    impl = _triton().fused_moe_wna16 if _use_triton(hidden) else _ref_wna16.fused_moe_wna16
    return impl(hidden, w13, w2, topk_weights, topk_ids)


def block_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ W.T + bias` with `W` an fp8 `[N, K]` weight scaled per `block` (`scale_inv`
    `[ceil(N / bn), ceil(K / bk)]`; `infernetes.kernels.reference.fp8_block`): the Triton GEMM
    scales each tile in registers, activations stay in their dtype."""
    _ref_fp8_block.check_block_shapes(x, weight, scale_inv, block)
    impl = _triton().block_fp8_linear if _use_triton(x) else _ref_fp8_block.block_fp8_linear
    return impl(x, weight, scale_inv, block, bias)


def lora_shrink(x: torch.Tensor, a_stack: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Per-token LoRA down projection: `x` `[T, K]`, `a_stack` `[slots, R, K]`, `indices` `[T]`
    (`-1`: no adapter, a zero row) -> `[T, R]`."""
    impl = _triton().lora_shrink if _use_triton(x) else _ref_lora.lora_shrink
    return impl(x, a_stack, indices)


def lora_expand(
    s: torch.Tensor, b_stack: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, offset: int
) -> None:
    """Per-token LoRA up projection added in place: `out[t, offset : offset + N] +=
    s[t] @ b_stack[indices[t]].T`; `b_stack` `[slots, N, R]`; rows with index `-1` untouched."""
    impl = _triton().lora_expand if _use_triton(s) else _ref_lora.lora_expand
    impl(s, b_stack, indices, out, offset)


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


def group_quant_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    group_size: int,
    bits: int,
    bias: torch.Tensor | None = None,
    int8_activations: bool = False,
) -> torch.Tensor:
    """`x @ W.T + bias` with `W` group-quantized (layout in
    `infernetes.kernels.reference.group_quant`): on the CPU the C kernel reads the 4- or 8-bit
    weights (with `int8_activations`, a Q8_0 weight's decode rows multiply x quantized to int8
    blocks, as llama.cpp does); elsewhere the reference dequantizes the whole weight."""
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        return _cpu_group_quant.group_quant_linear(
            x, qweight, scale, offset, group_size, bits, bias, int8_activations
        )
    return _ref_group_quant.group_quant_linear(x, qweight, scale, offset, group_size, bits, bias)
