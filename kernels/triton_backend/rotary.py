"""Rotary embedding (neox and GPT-J styles); one program per token, all heads of q and k."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.triton_backend.common import next_pow2


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    cos,
    sin,
    num_heads,
    head_dim,
    stride_t,
    stride_h,
    stride_out_t,
    stride_out_h,
    HALF: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_r[None, :] < HALF)
    base = x_ptr + token * stride_t + offs_h[:, None] * stride_h
    out_base = out_ptr + token * stride_out_t + offs_h[:, None] * stride_out_h
    if IS_NEOX:
        first, second = offs_r[None, :], offs_r[None, :] + HALF
    else:
        first, second = 2 * offs_r[None, :], 2 * offs_r[None, :] + 1
    x1 = tl.load(base + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + second, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_base + first, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(out_base + second, (x2 * cos + x1 * sin).to(dtype), mask=mask)
    if BLOCK_PASS > 0:  # features past rotary_dim pass through
        offs_p = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pmask = (offs_h[:, None] < num_heads) & (offs_p[None, :] < head_dim)
        tl.store(
            out_base + offs_p[None, :], tl.load(base + offs_p[None, :], mask=pmask), mask=pmask
        )


@triton.jit
def rotary_kernel(
    pos_ptr,
    cache_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    num_q_heads,
    num_k_heads,
    head_dim,
    stride_cache,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    HALF: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_HALF)
    rmask = offs_r < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_r, mask=rmask, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_r, mask=rmask, other=0.0)
    # cos/sin are rounded to the activation dtype first, as the reference (and transformers) do.
    cos = cos.to(q_out_ptr.dtype.element_ty).to(tl.float32)[None, :]
    sin = sin.to(q_out_ptr.dtype.element_ty).to(tl.float32)[None, :]
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        cos,
        sin,
        num_q_heads,
        head_dim,
        stride_qt,
        stride_qh,
        stride_qot,
        stride_qoh,
        HALF,
        IS_NEOX,
        BLOCK_HQ,
        BLOCK_HALF,
        BLOCK_PASS,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        cos,
        sin,
        num_k_heads,
        head_dim,
        stride_kt,
        stride_kh,
        stride_kot,
        stride_koh,
        HALF,
        IS_NEOX,
        BLOCK_HK,
        BLOCK_HALF,
        BLOCK_PASS,
    )


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if query.dtype != key.dtype:
        raise ValueError(f"query and key must share a dtype, got {query.dtype} and {key.dtype}")
    tokens, num_q_heads, head_dim = query.shape
    half = cos_sin_cache.shape[-1] // 2
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1:
        key = key.contiguous()
    cache = cos_sin_cache.contiguous()
    q_out, k_out = torch.empty_like(query), torch.empty_like(key)
    pass_dims = head_dim - 2 * half
    if tokens:
        rotary_kernel[(tokens,)](
            positions.contiguous(),
            cache,
            query,
            key,
            q_out,
            k_out,
            num_q_heads,
            key.shape[1],
            head_dim,
            cache.stride(0),
            query.stride(0),
            query.stride(1),
            key.stride(0),
            key.stride(1),
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            HALF=half,
            IS_NEOX=is_neox,
            BLOCK_HQ=next_pow2(num_q_heads),
            BLOCK_HK=next_pow2(key.shape[1]),
            BLOCK_HALF=next_pow2(half),
            BLOCK_PASS=next_pow2(pass_dims) if pass_dims else 0,
        )
    return q_out, k_out
