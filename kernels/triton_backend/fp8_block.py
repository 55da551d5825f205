"""The block-wise fp8 weight-only GEMM: each fp8 weight tile is scaled by its blocks' scales in
registers and multiplied with the activations in their own dtype, so decode reads a byte a
weight. Small batches split K across programs as the int4/int8 GEMM does (`wna16.py`). The
layout is `infernetes.kernels.reference.fp8_block`'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.triton_backend.common import dot_dtype, dot_precision
from infernetes.kernels.triton_backend.wna16 import k_splits


@triton.jit
def block_fp8_matmul_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    SCALE_COLS,
    stride_xm,
    stride_om,
    BLOCK_SN: tl.constexpr,
    BLOCK_SK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # Split-K: program (.., .., s) covers K_PER_SPLIT input features into slice s of the output.
    k_start = tl.program_id(2) * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    out_ptr += tl.program_id(2).to(tl.int64) * M * stride_om
    scale_rows = (offs_n // BLOCK_SN).to(tl.int64) * SCALE_COLS
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < k_end
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + kk[None, :],
            mask=(offs_m[:, None] < M) & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)
        tile_mask = mask_k[:, None] & mask_n[None, :]
        w = tl.load(
            w_ptr + offs_n[None, :].to(tl.int64) * K + kk[:, None], mask=tile_mask, other=0.0
        ).to(tl.float32)  # [BLOCK_K, BLOCK_N] of W^T
        scale = tl.load(
            scale_ptr + scale_rows[None, :] + (kk // BLOCK_SK)[:, None], mask=tile_mask, other=0.0
        )
        acc += tl.dot(x.to(DOT_DTYPE), (w * scale).to(DOT_DTYPE), input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & mask_n[None, :],
    )


def block_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    if not m:
        return x.new_empty(*x.shape[:-1], n)
    block_m, block_n, block_k = (16 if m <= 16 else 64), 64, 64
    splits = k_splits(m, n, k, block_n, block_k)
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    out = torch.empty(
        splits, m, n, dtype=x.dtype if splits == 1 else torch.float32, device=x.device
    )
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), splits)
    scale = scale_inv.float().contiguous()
    block_fp8_matmul_kernel[grid](
        x2,
        weight.contiguous(),
        scale,
        bias if bias is not None else scale,
        out,
        m,
        n,
        k,
        k_per_split,
        scale.shape[1],
        x2.stride(0),
        out.stride(1),
        BLOCK_SN=block[0],
        BLOCK_SK=block[1],
        HAS_BIAS=bias is not None and splits == 1,
        DOT_DTYPE=dot_dtype(x.dtype),
        PRECISION=dot_precision(dot_dtype(x.dtype)),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    result = out[0] if splits == 1 else out.sum(0).to(x.dtype)
    if bias is not None and splits > 1:
        result = result + bias
    return result.reshape(*x.shape[:-1], n)
