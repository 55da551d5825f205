"""store_kv: scatter new keys/values into the paged cache by slot, quantising for fp8 caches."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.reference.fp8 import FP8_DTYPES
from infernetes.kernels.triton_backend.common import (
    check_fp8_supported,
    fp8_rounding_args,
    next_pow2,
)
from infernetes.kernels.triton_backend.fp8_rounding import round_to_fp8_grid


@triton.jit
def _store_one(
    src_ptr,
    cache_ptr,
    scale_ptr,
    token,
    block,
    offset,
    valid,
    num_heads,
    head_dim,
    stride_st,
    stride_sh,
    stride_cb,
    stride_ct,
    stride_ch,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_PREROUND: tl.constexpr,
    FP8_MANTISSA: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # An invalid slot masks every head (`& valid` with a scalar mask fails in the interpreter).
    heads = tl.where(valid, num_heads, 0)
    mask = (offs_h[:, None] < heads) & (offs_d[None, :] < head_dim)
    x = tl.load(
        src_ptr + token * stride_st + offs_h[:, None] * stride_sh + offs_d[None, :], mask=mask
    )
    x = x.to(tl.float32)
    if FP8:
        # Saturate: fp8 e4m3 has no inf, an out-of-range value would become NaN.
        x = tl.clamp(x / tl.load(scale_ptr), -FP8_MAX, FP8_MAX)
        if FP8_PREROUND:
            x = round_to_fp8_grid(x, FP8_MANTISSA, FP8_MIN_EXP)
    dst = (
        cache_ptr
        + block * stride_cb
        + offset * stride_ct
        + offs_h[:, None] * stride_ch
        + offs_d[None, :]
    )
    tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_heads,
    head_dim,
    block_size,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8_PREROUND: tl.constexpr,
    FP8_MANTISSA: tl.constexpr,
    FP8_MIN_EXP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    valid = slot >= 0  # -1 marks padding tokens
    block = tl.where(valid, slot // block_size, 0)
    offset = tl.where(valid, slot % block_size, 0)
    _store_one(
        key_ptr,
        k_cache_ptr,
        k_scale_ptr,
        token,
        block,
        offset,
        valid,
        num_heads,
        head_dim,
        stride_kt,
        stride_kh,
        stride_kcb,
        stride_kct,
        stride_kch,
        FP8,
        FP8_MAX,
        FP8_PREROUND,
        FP8_MANTISSA,
        FP8_MIN_EXP,
        BLOCK_H,
        BLOCK_D,
    )
    _store_one(
        value_ptr,
        v_cache_ptr,
        v_scale_ptr,
        token,
        block,
        offset,
        valid,
        num_heads,
        head_dim,
        stride_vt,
        stride_vh,
        stride_vcb,
        stride_vct,
        stride_vch,
        FP8,
        FP8_MAX,
        FP8_PREROUND,
        FP8_MANTISSA,
        FP8_MIN_EXP,
        BLOCK_H,
        BLOCK_D,
    )


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8:
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        check_fp8_supported(k_cache)
        k_scale = torch.as_tensor(k_scale, dtype=torch.float32, device=key.device)
        v_scale = torch.as_tensor(v_scale, dtype=torch.float32, device=key.device)
    else:
        k_scale = v_scale = slot_mapping  # unused placeholders
    tokens, num_heads, head_dim = key.shape
    if not tokens:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    store_kv_kernel[(tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale,
        v_scale,
        num_heads,
        head_dim,
        k_cache.shape[1],
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        FP8=fp8,
        FP8_MAX=torch.finfo(k_cache.dtype).max if fp8 else 0.0,
        BLOCK_H=next_pow2(num_heads),
        BLOCK_D=next_pow2(head_dim),
        **fp8_rounding_args(k_cache.dtype),
    )
