"""Batched LoRA, one adapter per token (punica's BGMV), in Triton.

One program per (token, block of output features): it reads its token's slot and multiplies the
token's row with that slot's matrix; a token with slot ``-1`` stores zeros (shrink) or nothing
(expand). The grid depends on shapes alone, so a decode step with LoRA can be captured in a CUDA
graph with the slot indices in a static buffer. Signatures are the reference's
(`infernetes.kernels.reference.lora`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.triton_backend.common import next_pow2


@triton.jit
def lora_shrink_kernel(
    x_ptr,
    a_ptr,
    idx_ptr,
    out_ptr,
    R,
    K,
    stride_xt,
    stride_as,
    stride_ar,
    stride_ot,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    slot = tl.load(idx_ptr + token).to(tl.int64)
    active = (slot >= 0).to(tl.float32)  # 0 for a token of the base model
    slot = tl.maximum(slot, 0)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + token * stride_xt + k, mask=k < K, other=0.0)
        a = tl.load(
            a_ptr + slot * stride_as + r[:, None] * stride_ar + k[None, :],
            mask=(r[:, None] < R) & (k[None, :] < K),
            other=0.0,
        )
        acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    acc = acc * active
    tl.store(out_ptr + token * stride_ot + r, acc.to(out_ptr.dtype.element_ty), mask=r < R)


@triton.jit
def lora_expand_kernel(
    s_ptr,
    b_ptr,
    idx_ptr,
    out_ptr,
    N,
    R,
    offset,
    stride_st,
    stride_bs,
    stride_bn,
    stride_ot,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot = tl.load(idx_ptr + token).to(tl.int64)
    if slot >= 0:  # a token of the base model keeps its output as it is
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            s = tl.load(s_ptr + token * stride_st + r, mask=r < R, other=0.0)
            b = tl.load(
                b_ptr + slot * stride_bs + n[:, None] * stride_bn + r[None, :],
                mask=(n[:, None] < N) & (r[None, :] < R),
                other=0.0,
            )
            acc += tl.sum(b.to(tl.float32) * s.to(tl.float32)[None, :], axis=1)
        target = out_ptr + token * stride_ot + offset + n
        current = tl.load(target, mask=n < N, other=0.0).to(tl.float32)
        tl.store(target, (current + acc).to(out_ptr.dtype.element_ty), mask=n < N)


def lora_shrink(x: torch.Tensor, a_stack: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    a_stack = a_stack.contiguous()
    num_tokens, k = x.shape
    r = a_stack.shape[1]
    out = torch.empty(num_tokens, r, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block_r = min(next_pow2(r, 16), 64)
    block_k = min(next_pow2(k, 16), 128)
    grid = (num_tokens, triton.cdiv(r, block_r))
    lora_shrink_kernel[grid](
        x,
        a_stack,
        indices,
        out,
        r,
        k,
        x.stride(0),
        a_stack.stride(0),
        a_stack.stride(1),
        out.stride(0),
        BLOCK_R=block_r,
        BLOCK_K=block_k,
    )
    return out


def lora_expand(
    s: torch.Tensor, b_stack: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, offset: int
) -> None:
    s = s.contiguous()
    b_stack = b_stack.contiguous()
    if out.stride(1) != 1:
        raise ValueError("lora_expand writes into an output whose rows are contiguous")
    num_tokens, r = s.shape
    n = b_stack.shape[1]
    if num_tokens == 0:
        return
    block_n = min(next_pow2(n, 16), 64)
    block_r = min(next_pow2(r, 16), 64)
    grid = (num_tokens, triton.cdiv(n, block_n))
    lora_expand_kernel[grid](
        s,
        b_stack,
        indices,
        out,
        n,
        r,
        offset,
        s.stride(0),
        b_stack.stride(0),
        b_stack.stride(1),
        out.stride(0),
        BLOCK_N=block_n,
        BLOCK_R=block_r,
    )
