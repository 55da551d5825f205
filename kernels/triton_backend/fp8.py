"""fp8 quantisation and the fp8-weight linear layer.

On GPUs with fp8 tensor cores (compute capability 8.9+) `fp8_linear` quantises the activations
(per tensor, or per token when the weight has per-channel scales) and calls `torch._scaled_mm`.
Elsewhere (older GPUs, the interpreter, shapes `_scaled_mm` refuses) a Triton GEMM dequantises
the weight tile by tile: only the fp8 bytes are read from memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.reference.fp8 import MIN_SCALE, check_fp8_dtype
from infernetes.kernels.triton_backend.common import (
    check_fp8_supported,
    dot_dtype,
    dot_precision,
    fp8_rounding_args,
)
from infernetes.kernels.triton_backend.fp8_rounding import round_to_fp8_grid


@triton.jit
def quant_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n,
    FP8_MAX: tl.constexpr,
    FP8_PREROUND: tl.constexpr,
    FP8_MANTISSA: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = tl.clamp(x / tl.load(scale_ptr), -FP8_MAX, FP8_MAX)
    if FP8_PREROUND:
        q = round_to_fp8_grid(q, FP8_MANTISSA, FP8_MIN_EXP)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def quant_per_token_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    n,
    stride_x,
    stride_q,
    FP8_MAX: tl.constexpr,
    MIN_S: tl.constexpr,
    FP8_PREROUND: tl.constexpr,
    FP8_MANTISSA: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, n, BLOCK):  # pass 1: the row's absolute maximum
        x = tl.load(x_ptr + row * stride_x + k0 + offs, mask=k0 + offs < n, other=0.0).to(
            tl.float32
        )
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / FP8_MAX, MIN_S)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, n, BLOCK):  # pass 2: quantise
        mask = k0 + offs < n
        x = tl.load(x_ptr + row * stride_x + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
        if FP8_PREROUND:
            q = round_to_fp8_grid(q, FP8_MANTISSA, FP8_MIN_EXP)
        tl.store(q_ptr + row * stride_q + k0 + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


def scaled_fp8_quant(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_fp8_dtype(dtype)
    check_fp8_supported(x)
    fp8_max = torch.finfo(dtype).max
    if scale is None:  # one fused torch reduction; stays on the device (no sync)
        scale = (x.abs().amax().float() / fp8_max).clamp(min=MIN_SCALE) if x.numel() else None
        if scale is None:
            scale = torch.full((), MIN_SCALE, device=x.device)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    flat = x.contiguous().view(-1)
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    block = 1024
    if flat.numel():
        quant_kernel[(triton.cdiv(flat.numel(), block),)](
            flat, q, scale, flat.numel(), FP8_MAX=fp8_max, BLOCK=block, **fp8_rounding_args(dtype)
        )
    return q, scale


def quant_per_token(
    x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a `[M, K]` tensor to fp8, each with its own scale `[M, 1]`."""
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    scales = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
    if x.shape[0]:
        quant_per_token_kernel[(x.shape[0],)](
            x,
            q,
            scales,
            x.shape[1],
            x.stride(0),
            q.stride(0),
            FP8_MAX=torch.finfo(dtype).max,
            MIN_S=MIN_SCALE,
            BLOCK=min(triton.next_power_of_2(x.shape[1]), 2048),
            **fp8_rounding_args(dtype),
        )
    return q, scales


@triton.jit
def dequant_matmul_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    PER_CHANNEL: tl.constexpr,
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
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + kk[None, :],
            mask=(offs_m[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        w = tl.load(
            w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + kk[None, :],
            mask=(offs_n[:, None] < N) & (kk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=PRECISION)
    # The weight scale of a column factors out of its dot product: apply it once at the end.
    if PER_CHANNEL:
        acc = acc * tl.load(scale_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    else:
        acc = acc * tl.load(scale_ptr)
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
    )


def _dequant_linear(x2, qweight, scale, bias) -> torch.Tensor:
    m, k = x2.shape
    n = qweight.shape[0]
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    dtype = dot_dtype(x2.dtype)
    block_m = 16 if m <= 16 else 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
    dequant_matmul_kernel[grid](
        x2,
        qweight,
        scale,
        bias if bias is not None else scale,
        out,
        m,
        n,
        k,
        x2.stride(0),
        qweight.stride(0),
        out.stride(0),
        PER_CHANNEL=scale.numel() > 1,
        HAS_BIAS=bias is not None,
        DOT_DTYPE=dtype,
        PRECISION=dot_precision(dtype),
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_K=64,
    )
    return out


def _scaled_mm_usable(x2: torch.Tensor, qweight: torch.Tensor, per_channel: bool) -> bool:
    if not (x2.is_cuda and hasattr(torch, "_scaled_mm")):
        return False
    if torch.cuda.get_device_capability(x2.device) < (8, 9) or qweight.dtype != torch.float8_e4m3fn:
        return False
    # _scaled_mm needs dimensions that are multiples of 16; row-wise scales need a bf16 output.
    if x2.shape[1] % 16 or qweight.shape[0] % 16:
        return False
    return not per_channel or x2.dtype == torch.bfloat16


def fp8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    check_fp8_dtype(qweight.dtype)
    check_fp8_supported(qweight)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    scale = weight_scale.to(torch.float32).reshape(-1).contiguous()
    per_channel = scale.numel() > 1
    if x2.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], qweight.shape[0])
    if _scaled_mm_usable(x2, qweight, per_channel):
        if per_channel:
            xq, x_scale = quant_per_token(x2, qweight.dtype)
            w_scale = scale.view(1, -1)
        else:
            xq, x_scale = scaled_fp8_quant(x2, dtype=qweight.dtype)
            w_scale = scale.view(())
        # _scaled_mm takes no bias with row-wise scales or a float32 output: add it after.
        fused_bias = not per_channel and x.dtype != torch.float32
        out = torch._scaled_mm(
            xq,
            qweight.contiguous().t(),
            scale_a=x_scale,
            scale_b=w_scale,
            bias=bias if fused_bias else None,
            out_dtype=x.dtype,
        )
        if bias is not None and not fused_bias:
            out = out + bias
    else:
        out = _dequant_linear(x2, qweight.contiguous(), scale, bias)
    return out.reshape(*x.shape[:-1], qweight.shape[0])
