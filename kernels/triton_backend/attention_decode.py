"""Decode attention (one query token per sequence), flash-decoding style.

The KV range of each sequence is split into `num_splits` pieces that run as separate programs
(so a few long sequences still fill the GPU); each program handles all the query heads that
share one kv head (GQA), as rows of one matmul. A second kernel merges the pieces' partial
softmax results; with a single split the first kernel writes the output itself.
"""

from __future__ import annotations

import triton
import triton.language as tl
from infernetes.kernels.triton_backend.attention_tiles import (
    fold_in_sinks,
    load_kv_tile,
    online_softmax_step,
)


@triton.jit
def decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    tables_ptr,
    seq_lens_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    sinks_ptr,
    qk_scale,
    softcap,
    window,
    group,
    head_dim,
    block_size,
    stride_qt,
    stride_qh,
    stride_tables,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    FP8: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * group

    seq_len = tl.load(seq_lens_ptr + seq)
    first = tl.maximum(
        seq_len - window, 0
    )  # the oldest key the query sees (window is huge without one)
    split_len = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < group
    mask_d = offs_d < head_dim
    heads = kv_head * group + offs_g
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_g[:, None] & mask_d[None, :],
        other=0.0,
    ).to(DOT_DTYPE)
    score_scale = qk_scale
    v_scale = 1.0
    if FP8:
        score_scale = qk_scale * tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table_row = tables_ptr + seq * stride_tables
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k = load_kv_tile(
            k_cache_ptr,
            table_row,
            offs_n,
            mask_n,
            kv_head,
            offs_d,
            mask_d,
            block_size,
            stride_kb,
            stride_kt,
            stride_kh,
            DOT_DTYPE,
        )
        v = load_kv_tile(
            v_cache_ptr,
            table_row,
            offs_n,
            mask_n,
            kv_head,
            offs_d,
            mask_d,
            block_size,
            stride_vb,
            stride_vt,
            stride_vh,
            DOT_DTYPE,
        )
        m_i, l_i, acc = online_softmax_step(
            q,
            k,
            v,
            mask_n[None, :],
            m_i,
            l_i,
            acc,
            score_scale,
            softcap,
            DOT_DTYPE,
            PRECISION,
            SOFTCAP,
        )

    if NUM_SPLITS == 1:  # nothing to merge (l is 0 only for a padding row: output 0)
        if SINKS:
            m_i, l_i, acc = fold_in_sinks(sinks_ptr, heads, mask_g, m_i, l_i, acc)
        out = acc * v_scale / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=mask_g[:, None] & mask_d[None, :],
        )
        return
    # partials: [seq, head, split] (+ [D] for acc); an empty split leaves m=-inf, l=0, acc=0
    part = (seq * num_heads + heads) * NUM_SPLITS + split
    tl.store(part_m_ptr + part, m_i, mask=mask_g)
    tl.store(part_l_ptr + part, l_i, mask=mask_g)
    tl.store(
        part_acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
        acc * v_scale,
        mask=mask_g[:, None],
    )


@triton.jit
def decode_merge_kernel(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    sinks_ptr,
    head_dim,
    stride_ot,
    stride_oh,
    SINKS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS + offs_s
    m = tl.load(part_m_ptr + part, mask=mask_s, other=float("-inf"))
    l_part = tl.load(part_l_ptr + part, mask=mask_s, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :], mask=mask_s[:, None], other=0.0
    )
    m_max = tl.max(m, axis=0)
    if SINKS:  # the sink joins the denominator once, here
        m_max = tl.maximum(m_max, tl.load(sinks_ptr + head))
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty (a padding row)
    weight = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
    total = tl.sum(weight * l_part, axis=0)
    if SINKS:
        total += tl.exp2(tl.load(sinks_ptr + head) - m_max)
    # A padding row (seq_len 0, as in a padded CUDA-graph batch) has no keys: output 0, not NaN.
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + seq * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < head_dim,
    )
