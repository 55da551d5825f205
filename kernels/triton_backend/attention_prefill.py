"""Variable-length causal attention over the paged cache: prefill, chunked prefill over a cached
prefix (prefix-cache hits), and mixed batches.

A program takes a tile of BLOCK_Q query tokens of one sequence times the query heads of one kv
head (GQA): the rows of its matmuls are (token, head) pairs. It walks the sequence's KV through the
block table up to the causal limit of its last token. The grid is fixed by shapes only (no host
sync, CUDA-graph safe): sequence b owns tiles from `cu_seqlens_q[b] // BLOCK_Q + b` on, found by
binary search; spare tiles exit at once.
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
def _find_sequence(cu_q_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence b whose first tile `cu_q[b] // BLOCK_Q + b` is at or before `tile`."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_q_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    tables_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    out_ptr,
    sinks_ptr,
    qk_scale,
    softcap,
    window,
    num_seqs,
    group,
    head_dim,
    block_size,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_tables,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    FP8: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(cu_q_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    local_tile = tile - (q_start // BLOCK_Q + seq)
    if local_tile * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        context = seq_len - q_len  # tokens cached before this step's queries

        BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
        rows = tl.arange(0, BLOCK_M)
        q_idx = local_tile * BLOCK_Q + rows // GROUP_PAD  # query token within the sequence
        g = rows % GROUP_PAD
        heads = kv_head * group + g
        mask_m = (q_idx < q_len) & (g < group)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        tokens = (q_start + q_idx).to(tl.int64)
        q = tl.load(
            q_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        ).to(DOT_DTYPE)
        score_scale = qk_scale
        v_scale = 1.0
        if FP8:
            score_scale = qk_scale * tl.load(k_scale_ptr)
            v_scale = tl.load(v_scale_ptr)
        q_pos = context + q_idx  # absolute position of each row's token

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        table_row = tables_ptr + seq.to(tl.int64) * stride_tables
        kv_end = tl.minimum(seq_len, context + (local_tile + 1) * BLOCK_Q)
        # The tile's first query sees `window` positions back at most (window is huge without one).
        kv_start = tl.maximum(context + local_tile * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N
        for n0 in range(kv_start, kv_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < kv_end
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
            visible = (
                mask_n[None, :]
                & (offs_n[None, :] <= q_pos[:, None])
                & (offs_n[None, :] > q_pos[:, None] - window)
            )
            m_i, l_i, acc = online_softmax_step(
                q,
                k,
                v,
                visible,
                m_i,
                l_i,
                acc,
                score_scale,
                softcap,
                DOT_DTYPE,
                PRECISION,
                SOFTCAP,
            )

        if SINKS:
            m_i, l_i, acc = fold_in_sinks(sinks_ptr, heads, mask_m, m_i, l_i, acc)
        out = acc * v_scale / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_d[None, :],
        )
