"""Pieces the attention kernels share: gathering a tile of the paged cache, one online-softmax
step. Scores live in the log2 domain (scaled by softmax scale * log2(e)) so the kernels use exp2.

Tiles stay in the matmul dtype (bf16/fp16 on a GPU) to keep registers free; an fp8 cache's scales
are applied once per score (k_scale) and once to the output (v_scale), never per element."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    cache_ptr,
    table_row_ptr,
    offs_n,
    mask_n,
    kv_head,
    offs_d,
    mask_d,
    block_size,
    stride_b,
    stride_t,
    stride_h,
    DOT_DTYPE: tl.constexpr,
):
    """Tokens `offs_n` of one sequence, for one kv head -> `[BLOCK_N, BLOCK_D]` in DOT_DTYPE."""
    block = tl.load(table_row_ptr + offs_n // block_size, mask=mask_n, other=0).to(tl.int64)
    rows = block * stride_b + (offs_n % block_size) * stride_t + kv_head * stride_h
    tile = tl.load(
        cache_ptr + rows[:, None] + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    )
    return tile.to(DOT_DTYPE)


@triton.jit
def fold_in_sinks(sinks_ptr, heads, mask, m_i, l_i, acc):
    """Attention sinks: one more logit per head (log2 domain) in the softmax's denominator,
    with no value to add to the output."""
    sink = tl.load(sinks_ptr + heads, mask=mask, other=0.0)
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)
    return m_new, l_i * alpha + tl.exp2(sink - m_new), acc * alpha[:, None]


@triton.jit
def online_softmax_step(
    q,
    k,
    v,
    valid,
    m_i,
    l_i,
    acc,
    score_scale,
    softcap,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Fold one KV tile into the running max `m_i`, sum `l_i` and output `acc` of each row.
    `q`, `k`, `v` are in DOT_DTYPE; `score_scale` = softmax scale * log2(e) * k_scale; with
    SOFTCAP, `softcap` is the cap times log2(e) (the scores' domain)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * score_scale
    if SOFTCAP:  # cap * tanh(s / cap), tanh(y) = 1 - 2 / (e^2y + 1): saturates without NaN
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # Rows with nothing visible yet keep m = -inf; use 0 there so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
    return m_new, l_i, acc
