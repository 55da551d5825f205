"""Mixture of experts over 4- or 8-bit packed expert weights (w4a16, w8a16): the grouped GEMMs of
`moe.py` (rows sorted by expert, each block of rows one expert's) with the weight tiles of
`wna16.py` (unpacked and scaled in registers), so decode reads the experts' packed words, not a
model-dtype copy. The layout is `infernetes.kernels.reference.wna16.PackedExperts`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.reference.wna16 import PackedExperts, check_bits
from infernetes.kernels.triton_backend.common import dot_dtype, dot_precision
from infernetes.kernels.triton_backend.moe import grouped_experts
from infernetes.kernels.triton_backend.wna16 import dequantized_tile


@triton.jit
def moe_wna16_gemm_kernel(
    a_ptr,
    qw_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    weight_ptr,
    out_ptr,
    sorted_rows_ptr,
    block_expert_ptr,
    num_rows,
    N,
    K,
    G,
    stride_am,
    stride_om,
    A_ROW_DIV: tl.constexpr,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    MUL_ROUTING_WEIGHT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    PACK: tl.constexpr = 32 // BITS
    expert = tl.load(block_expert_ptr + tl.program_id(0))
    if expert < 0:  # a block past the last expert's run
        return
    rows = tl.load(sorted_rows_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = rows < num_rows  # padding rows carry num_rows
    a_rows = (rows // A_ROW_DIV).to(tl.int64)  # as in moe.py: a token's row, or the row's own
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    e = expert.to(tl.int64)
    qw_base = qw_ptr + e * (K // PACK) * N
    group_base = e * G * N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_am + kk[None, :],
            mask=valid[:, None] & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)
        w = dequantized_tile(
            qw_base,
            scales_ptr + group_base,
            zeros_ptr + group_base,
            g_idx_ptr + e * K,
            kk,
            offs_n,
            mask_k,
            mask_n,
            N,
            BITS,
            HAS_ZEROS,
            BLOCK_K,
            BLOCK_N,
        )
        acc += tl.dot(a.to(DOT_DTYPE), w.to(DOT_DTYPE), input_precision=PRECISION)
    if MUL_ROUTING_WEIGHT:
        acc = acc * tl.load(weight_ptr + rows, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=valid[:, None] & mask_n[None, :],
    )


def _grouped_gemm(
    a: torch.Tensor,
    experts: PackedExperts,
    routing_weights: torch.Tensor | None,
    sorted_rows: torch.Tensor,
    block_expert: torch.Tensor,
    num_rows: int,
    a_row_div: int,
    block_m: int,
) -> torch.Tensor:
    pack = check_bits(experts.bits)
    _, words, n = experts.qweight.shape
    k, groups = words * pack, experts.scales.shape[1]
    # Zeroed for the weighted output: rows of id -1 (another rank's experts) stay unwritten.
    alloc = torch.empty if routing_weights is None else torch.zeros
    out = alloc(num_rows, n, dtype=a.dtype, device=a.device)
    scales = experts.scales.contiguous()
    dtype = dot_dtype(a.dtype)
    grid = (block_expert.numel(), triton.cdiv(n, 64))
    moe_wna16_gemm_kernel[grid](
        a,
        experts.qweight.contiguous(),
        scales,
        experts.zeros.contiguous() if experts.zeros is not None else scales,
        experts.g_idx.to(torch.int32).contiguous(),
        routing_weights if routing_weights is not None else scales,
        out,
        sorted_rows,
        block_expert,
        num_rows,
        n,
        k,
        groups,
        a.stride(0),
        out.stride(0),
        A_ROW_DIV=a_row_div,
        BITS=experts.bits,
        HAS_ZEROS=experts.zeros is not None,
        MUL_ROUTING_WEIGHT=routing_weights is not None,
        DOT_DTYPE=dtype,
        PRECISION=dot_precision(dtype),
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_K=64,
    )
    return out


def fused_moe_wna16(
    hidden: torch.Tensor,
    w13: PackedExperts,
    w2: PackedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    experts = {"w13": w13, "w2": w2}

    def gemm(a, which, routing_weights, *blocks):
        return _grouped_gemm(a, experts[which], routing_weights, *blocks)

    return grouped_experts(hidden, topk_weights, topk_ids, w13.qweight.shape[0], gemm)
