"""paged_attention: the split-K decode kernel for decode-only batches, the varlen prefill kernel
for everything else. Launch parameters depend on tensor shapes only, never on their values, so
the call is CUDA-graph safe."""

from __future__ import annotations

import math

import torch
import triton.language as tl
from infernetes.kernels.reference.fp8 import FP8_DTYPES
from infernetes.kernels.triton_backend.attention_decode import (
    decode_merge_kernel,
    decode_split_kernel,
)
from infernetes.kernels.triton_backend.attention_prefill import prefill_kernel
from infernetes.kernels.triton_backend.common import check_fp8_supported, dot_dtype, next_pow2

LOG2E = 1.4426950408889634
MAX_SPLITS = 32
NO_WINDOW = 1 << 30
# Fewer tokens than this per split is not worth a separate program.
MIN_TOKENS_PER_SPLIT = 128


def num_decode_splits(
    num_seqs: int, num_kv_heads: int, max_kv_len: int, device: torch.device
) -> int:
    """Enough programs to fill the GPU about twice, without splits shorter than
    MIN_TOKENS_PER_SPLIT. On an H100 (Llama-8B heads, bf16, graph replay, fraction of copy
    bandwidth) one sequence of 32k tokens reads at 0.53 with 16 splits and 0.78 with 32."""
    programs = num_seqs * num_kv_heads
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 4
    )
    wanted = math.ceil(2 * sms / max(programs, 1))
    return int(max(1, min(wanted, MAX_SPLITS, max_kv_len // MIN_TOKENS_PER_SPLIT)))


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
    num_splits: int | None = None,
) -> torch.Tensor:
    """`num_splits` overrides the decode split count (tests use it to cover the merge)."""
    tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(
            f"query heads ({num_heads}) must be a multiple of kv heads ({num_kv_heads})"
        )
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8:
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        check_fp8_supported(k_cache)
        k_scale = torch.as_tensor(k_scale, dtype=torch.float32, device=query.device)
        v_scale = torch.as_tensor(v_scale, dtype=torch.float32, device=query.device)
    else:
        k_scale = v_scale = seq_lens  # unused placeholders
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = torch.empty_like(query)
    if tokens == 0:
        return out
    group = num_heads // num_kv_heads
    block_d = next_pow2(head_dim, 16)
    dtype = dot_dtype(query.dtype)
    precision = "ieee" if dtype == tl.float32 else "tf32"
    common = dict(
        FP8=fp8,
        SOFTCAP=bool(softcap),
        SINKS=sinks is not None,
        DOT_DTYPE=dtype,
        PRECISION=precision,
        BLOCK_D=block_d,
    )
    # sinks in the scores' log2 domain (a device op: no sync, graph safe); else a placeholder
    sinks_log2 = (sinks.float() * LOG2E).contiguous() if sinks is not None else seq_lens
    # In the scores' log2 domain; a window past any context stands for "no window" (one code path).
    softcap_log2 = (softcap or 0.0) * LOG2E
    window = sliding_window or NO_WINDOW
    cache_strides = (
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
    )

    if tokens == num_seqs:  # every sequence has exactly one query token: a decode step
        max_kv_len = min(block_tables.shape[1] * block_size, window)
        splits = num_splits or num_decode_splits(num_seqs, num_kv_heads, max_kv_len, query.device)
        # split partials (unused, one element, when there is a single split)
        parts = (num_seqs, num_heads, splits) if splits > 1 else (1, 1, 1)
        part_acc = torch.empty(*parts, block_d, dtype=torch.float32, device=query.device)
        part_m = torch.empty(parts, dtype=torch.float32, device=query.device)
        part_l = torch.empty_like(part_m)
        decode_split_kernel[(num_seqs, num_kv_heads, splits)](
            query,
            k_cache,
            v_cache,
            k_scale,
            v_scale,
            block_tables,
            seq_lens,
            part_acc,
            part_m,
            part_l,
            out,
            sinks_log2,
            scale * LOG2E,
            softcap_log2,
            window,
            group,
            head_dim,
            block_size,
            query.stride(0),
            query.stride(1),
            block_tables.stride(0),
            *cache_strides,
            out.stride(0),
            out.stride(1),
            NUM_SPLITS=splits,
            BLOCK_G=next_pow2(group, 16),
            BLOCK_N=64 if block_d <= 128 else 32,
            **common,
        )
        if splits > 1:
            decode_merge_kernel[(num_seqs, num_heads)](
                part_acc,
                part_m,
                part_l,
                out,
                sinks_log2,
                head_dim,
                out.stride(0),
                out.stride(1),
                SINKS=sinks is not None,
                NUM_SPLITS=splits,
                BLOCK_S=next_pow2(splits),
                BLOCK_D=block_d,
            )
        return out

    group_pad = next_pow2(group)
    block_q = max(16 // group_pad, 1) if tokens <= 4 * num_seqs else max(64 // group_pad, 1)
    prefill_kernel[(tokens // block_q + num_seqs, num_kv_heads)](
        query,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        out,
        sinks_log2,
        scale * LOG2E,
        softcap_log2,
        window,
        num_seqs,
        group,
        head_dim,
        block_size,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        *cache_strides,
        BLOCK_Q=block_q,
        GROUP_PAD=group_pad,
        BLOCK_N=64 if block_d <= 128 else 32,
        **common,
    )
    return out
