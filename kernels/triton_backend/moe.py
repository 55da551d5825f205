"""Mixture of experts as two grouped GEMMs over tokens sorted by expert.

Each (token, chosen expert) pair is a row. The rows are sorted by expert and each expert's run is
padded to a multiple of BLOCK_M, so every block of BLOCK_M rows belongs to one expert: a program
loads that expert's weight tiles once for all its rows (the experts' weights are read once per
step, which is what bounds decode). The first GEMM gives each row its gate and up projections,
the activation runs between, the second GEMM multiplies by the down projection and the routing
weight, and the k rows of a token are summed. fp8 weights are dequantised tile by tile.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from infernetes.kernels.reference.fp8 import FP8_DTYPES
from infernetes.kernels.reference.moe import check_expert_scales, check_moe_shapes
from infernetes.kernels.triton_backend.activation import silu_and_mul
from infernetes.kernels.triton_backend.common import dot_dtype, dot_precision

SCALE_NONE, SCALE_PER_EXPERT, SCALE_PER_CHANNEL, SCALE_PER_BLOCK = 0, 1, 2, 3


@triton.jit
def moe_gemm_kernel(
    a_ptr,
    w_ptr,
    scale_ptr,
    weight_ptr,
    out_ptr,
    sorted_rows_ptr,
    block_expert_ptr,
    num_rows,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    stride_se,
    scale_cols,
    A_ROW_DIV: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    BLOCK_SN: tl.constexpr,
    BLOCK_SK: tl.constexpr,
    MUL_ROUTING_WEIGHT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    expert = tl.load(block_expert_ptr + tl.program_id(0))
    if expert < 0:  # a block past the last expert's run
        return
    rows = tl.load(sorted_rows_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < num_rows  # padding rows carry num_rows
    # Row r is (token r // top_k, its (r % top_k)-th expert): the first GEMM reads the token's
    # hidden state (A_ROW_DIV = top_k), the second the row's own activation (A_ROW_DIV = 1).
    a_rows = (rows // A_ROW_DIV).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    scale_rows = expert.to(tl.int64) * stride_se + (offs_n // BLOCK_SN).to(tl.int64) * scale_cols
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_am + kk[None, :],
            mask=valid[:, None] & (kk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        tile_mask = (offs_n[:, None] < N) & (kk[None, :] < K)
        w = tl.load(
            w_base + offs_n[:, None].to(tl.int64) * stride_wn + kk[None, :],
            mask=tile_mask,
            other=0.0,
        ).to(tl.float32)
        if SCALE_MODE == 3:  # block-wise fp8: each element by its block's scale, in registers
            w = w * tl.load(
                scale_ptr + scale_rows[:, None] + (kk // BLOCK_SK)[None, :],
                mask=tile_mask,
                other=0.0,
            )
        acc += tl.dot(a.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=PRECISION)
    # A scale per expert or output factors out of the dot product: applied once at the end.
    if SCALE_MODE == 1:
        acc = acc * tl.load(scale_ptr + expert)
    elif SCALE_MODE == 2:
        acc = acc * tl.load(scale_ptr + expert * N + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if MUL_ROUTING_WEIGHT:
        acc = acc * tl.load(weight_ptr + rows, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=valid[:, None] & (offs_n[None, :] < N),
    )


def sort_rows_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted_rows, block_expert)``: the rows (flat indices into ``topk_ids``) grouped by
    expert, each group padded with ``topk_ids.numel()`` to a multiple of ``block_m``, and the
    expert of each block (-1 past the last, and for the rows of id -1: another rank's experts,
    grouped last). Sized for the worst case, so no host sync."""
    flat = topk_ids.reshape(-1).long()
    flat = torch.where(flat < 0, num_experts, flat)
    num_rows = flat.numel()
    # scatter_add into a fixed size, not bincount: bincount reads the largest id on the host,
    # which a CUDA graph capture refuses (measured on an H200: every MoE model's capture failed)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    experts_in_order = flat[order]
    rank_in_expert = (
        torch.arange(num_rows, device=flat.device) - (counts.cumsum(0) - counts)[experts_in_order]
    )
    capacity = triton.cdiv(num_rows + (num_experts + 1) * (block_m - 1), block_m) * block_m
    sorted_rows = torch.full((capacity,), num_rows, dtype=torch.int32, device=flat.device)
    sorted_rows[(ends - padded)[experts_in_order] + rank_in_expert] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=flat.device)
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_rows, block_expert


def _scale_mode(weight: torch.Tensor, scale: torch.Tensor | None) -> tuple[int, torch.Tensor]:
    if weight.dtype not in FP8_DTYPES:
        return SCALE_NONE, weight.new_empty(1, 1, 1, dtype=torch.float32)
    if scale is None:
        raise ValueError("fp8 expert weights need their scales")
    modes = {1: SCALE_PER_EXPERT, 2: SCALE_PER_CHANNEL, 3: SCALE_PER_BLOCK}
    return modes[scale.dim()], scale.float().reshape(*scale.shape, *[1] * (3 - scale.dim()))


def _grouped_gemm(
    a,
    weight,
    scale,
    block,
    routing_weights,
    sorted_rows,
    block_expert,
    num_rows,
    a_row_div,
    block_m,
) -> torch.Tensor:
    _, n, k = weight.shape
    # Zeroed for the weighted output: rows of id -1 (another rank's experts) stay unwritten.
    alloc = torch.empty if routing_weights is None else torch.zeros
    out = alloc(num_rows, n, dtype=a.dtype, device=a.device)
    mode, scale = _scale_mode(weight, scale)
    scale = scale.contiguous()
    dtype = dot_dtype(a.dtype)
    grid = (block_expert.numel(), triton.cdiv(n, 64))
    moe_gemm_kernel[grid](
        a,
        weight,
        scale,
        routing_weights,
        out,
        sorted_rows,
        block_expert,
        num_rows,
        n,
        k,
        a.stride(0),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        scale.stride(0),
        scale.stride(1),
        A_ROW_DIV=a_row_div,
        SCALE_MODE=mode,
        BLOCK_SN=block[0] if block else 1,
        BLOCK_SK=block[1] if block else 1,
        MUL_ROUTING_WEIGHT=routing_weights is not None,
        DOT_DTYPE=dtype,
        PRECISION=dot_precision(dtype),
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_K=64,
    )
    return out


def grouped_experts(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    gemm: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """The MoE block around a grouped GEMM: rows sorted by expert, ``gemm(a, which, routing
    weights or None, sorted_rows, block_expert, num_rows, a_row_div, block_m)`` for ``which``
    "w13" (gate and up, of each token's hidden state) then "w2" (down, of the activation,
    weighted), and the k rows of a token summed."""
    tokens, top_k = topk_ids.shape
    if tokens == 0:
        return torch.empty_like(hidden)
    hidden = hidden.contiguous()
    # Small batches (decode) waste less padding with short blocks; each block reads its
    # expert's weights once, so longer blocks pay off when experts have many rows.
    block_m = 16 if tokens * top_k <= 64 * num_experts else 64
    sorted_rows, block_expert = sort_rows_by_expert(topk_ids, num_experts, block_m)
    num_rows = tokens * top_k
    blocks = (sorted_rows, block_expert, num_rows)
    gate_up = gemm(hidden, "w13", None, *blocks, top_k, block_m)
    weights = topk_weights.float().contiguous()
    down = gemm(silu_and_mul(gate_up), "w2", weights, *blocks, 1, block_m)
    return down.view(tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(hidden.dtype)


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
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids)
    check_expert_scales(w13, w13_scale, block)
    check_expert_scales(w2, w2_scale, block)
    weights = {
        "w13": (w13.contiguous(), w13_scale, block),
        "w2": (w2.contiguous(), w2_scale, block),
    }

    def gemm(a, which, routing_weights, *blocks):
        return _grouped_gemm(a, *weights[which], routing_weights, *blocks)

    return grouped_experts(hidden, topk_weights, topk_ids, w13.shape[0], gemm)
