"""The weight-only integer GEMM (w4a16, w8a16): each tile of packed weights is unpacked and scaled
in registers, so only the 4- or 8-bit words cross memory. The layout is described in
`infernetes.kernels.reference.wna16`; a per-feature group index covers GPTQ's reordered groups.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.reference.wna16 import check_bits
from infernetes.kernels.triton_backend.common import dot_dtype, dot_precision


@triton.jit
def dequantized_tile(
    qw_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    kk,
    offs_n,
    mask_k,
    mask_n,
    N,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The ``[BLOCK_K, BLOCK_N]`` tile of ``W^T`` at input features ``kk`` and outputs
    ``offs_n``, unpacked and scaled in registers (float32; zero where masked)."""
    PACK: tl.constexpr = 32 // BITS
    tile_mask = mask_k[:, None] & mask_n[None, :]
    # Each word holds PACK consecutive input features of one output column.
    words = tl.load(
        qw_ptr + (kk[:, None] // PACK).to(tl.int64) * N + offs_n[None, :],
        mask=tile_mask,
        other=0,
    )
    q = (words >> ((kk[:, None] % PACK) * BITS)) & ((1 << BITS) - 1)
    group = tl.load(g_idx_ptr + kk, mask=mask_k, other=0).to(tl.int64)
    where = group[:, None] * N + offs_n[None, :]
    scale = tl.load(scales_ptr + where, mask=tile_mask, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        zero = tl.load(zeros_ptr + where, mask=tile_mask, other=0).to(tl.float32)
    else:
        zero = tl.full([BLOCK_K, BLOCK_N], 1 << (BITS - 1), tl.float32)
    return (q.to(tl.float32) - zero) * scale


@triton.jit
def wna16_matmul_kernel(
    x_ptr,
    qw_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_xm,
    stride_om,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
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
    # Split-K: program (.., .., s) covers K_PER_SPLIT input features and writes its partial sums
    # to slice s of the output (summed by the caller); one split writes the result itself.
    k_start = tl.program_id(2) * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    out_ptr += tl.program_id(2).to(tl.int64) * M * stride_om
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < k_end
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + kk[None, :],
            mask=(offs_m[:, None] < M) & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)
        w = dequantized_tile(
            qw_ptr,
            scales_ptr,
            zeros_ptr,
            g_idx_ptr,
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
        acc += tl.dot(x.to(DOT_DTYPE), w.to(DOT_DTYPE), input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & mask_n[None, :],
    )


def wna16_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor,
    bits: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    pack = check_bits(bits)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = x2.shape
    n = qweight.shape[1]
    if qweight.shape[0] * pack != k:
        raise ValueError(f"packed weight {tuple(qweight.shape)} does not fit {k} input features")
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
    wna16_matmul_kernel[grid](
        x2,
        qweight.contiguous(),
        scales.contiguous(),
        zeros.contiguous() if zeros is not None else scales,
        g_idx.to(torch.int32).contiguous(),
        bias if bias is not None else scales,
        out,
        m,
        n,
        k,
        k_per_split,
        x2.stride(0),
        out.stride(1),
        BITS=bits,
        HAS_ZEROS=zeros is not None,
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


def k_splits(m: int, n: int, k: int, block_n: int, block_k: int) -> int:
    """How many K ranges small batches (decode) split into, so the weight stream is read by
    enough programs to fill the GPU: about 256 programs, each at least 4 tiles of K."""
    if m > 16:
        return 1
    programs = triton.cdiv(n, block_n)
    return max(1, min(256 // programs, k // (4 * block_k)))
