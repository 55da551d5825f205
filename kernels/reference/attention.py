"""Attention over the paged KV cache with torch's scaled_dot_product_attention.

Decode rows (one query token) of a batch go through one batched call with a padding mask; each
prefill or chunked-prefill sequence gets its own call with a causal mask shifted by its cached
prefix. The block tables are read on the host: this is the CPU path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infernetes.kernels.reference.fp8 import FP8_DTYPES


def gather_kv(
    cache: torch.Tensor, tables: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """The blocks of `tables` `[B, n]` as `[B, n * block_size, Hkv, D]` in `dtype`."""
    n_seqs, n_blocks = tables.shape
    _, block_size, n_kv_heads, head_dim = cache.shape
    ids = tables.reshape(-1).long()
    if cache.dtype in FP8_DTYPES:
        if scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        # index_select is not implemented for fp8 everywhere; gather the bytes.
        raw = cache.view(torch.uint8).flatten(1).index_select(0, ids).view(cache.dtype)
        blocks = (raw.float() * scale.float()).to(dtype)
    else:
        blocks = cache.flatten(1).index_select(0, ids).to(dtype)  # faster than cache[tables] on CPU
    return blocks.reshape(n_seqs, n_blocks * block_size, n_kv_heads, head_dim)


def _sdpa_prefill(q, k, v, mask, scale):
    """q `[1, H, Lq, D]`, k/v `[1, Hkv, Lk, D]`; `mask` None means plain causal."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)


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
) -> torch.Tensor:
    out = torch.empty_like(query)
    block_size = k_cache.shape[1]
    starts = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    decodes = [b for b, n in enumerate(q_lens) if n == 1 and lens[b] > 0]
    for b, n in enumerate(q_lens):
        if n == 1 and lens[b] == 0:  # a padding row: nothing to attend to
            out[starts[b]] = 0
    if decodes:
        _decode(query, k_cache, v_cache, block_tables, starts, lens, decodes, scale, k_scale, v_scale, out)
    for b, q_len in enumerate(q_lens):
        if q_len <= 1:
            continue
        kv_len = lens[b]
        n_blocks = -(-kv_len // block_size)
        tables = block_tables[b : b + 1, :n_blocks]
        k = gather_kv(k_cache, tables, k_scale, query.dtype)[:, :kv_len].transpose(1, 2)
        v = gather_kv(v_cache, tables, v_scale, query.dtype)[:, :kv_len].transpose(1, 2)
        q = query[starts[b] : starts[b + 1]].transpose(0, 1).unsqueeze(0)
        mask = None  # no cached prefix: plain causal
        if kv_len > q_len:  # query i sits at position kv_len - q_len + i and sees keys up to it
            q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)
            mask = torch.arange(kv_len, device=query.device)[None, :] <= q_pos[:, None]
        out[starts[b] : starts[b + 1]] = _sdpa_prefill(q, k, v, mask, scale)[0].transpose(0, 1)
    return out


def _gather_tokens(
    cache: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """The tokens at `slots` `[N]` (slot = block * block_size + offset) as `[N, Hkv, D]` in `dtype`."""
    flat = cache.view(-1, *cache.shape[2:])
    if cache.dtype in FP8_DTYPES:
        if scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        raw = flat.view(torch.uint8).index_select(0, slots).view(cache.dtype)
        return (raw.float() * scale.float()).to(dtype)
    return flat.index_select(0, slots).to(dtype)


def _decode(query, k_cache, v_cache, block_tables, starts, lens, decodes, scale, k_scale, v_scale, out):
    device = query.device
    block_size, n_kv_heads, head_dim = k_cache.shape[1:]
    rows = torch.tensor(decodes, device=device)
    kv_lens = torch.tensor([lens[b] for b in decodes], device=device)
    longest = max(lens[b] for b in decodes)
    n_blocks = -(-longest // block_size)
    tables = block_tables[rows, :n_blocks].long()
    # Gather by slot. Positions past a sequence's end read its first token instead of whatever the
    # cache holds there (stale or NaN bit patterns): masked out, a finite value weighs exactly zero,
    # while a NaN would still poison the softmax and the weighted sum.
    pos = torch.arange(longest, device=device)
    valid = pos[None, :] < kv_lens[:, None]  # [Bd, L]
    slots = tables[:, pos // block_size] * block_size + pos % block_size
    slots = torch.where(valid, slots, slots[:, :1]).reshape(-1)
    n_seqs, n_heads = len(decodes), query.shape[1]
    k = _gather_tokens(k_cache, slots, k_scale, query.dtype)
    v = _gather_tokens(v_cache, slots, v_scale, query.dtype)
    k = k.view(n_seqs, longest, n_kv_heads, head_dim).transpose(1, 2)
    v = v.view(n_seqs, longest, n_kv_heads, head_dim).transpose(1, 2)
    token_rows = torch.tensor([starts[b] for b in decodes], device=device)
    # GQA without copying K/V per query head: the heads sharing a kv head become that kv head's
    # query rows (one query token each, so one mask serves them all).
    q = query[token_rows].view(n_seqs, n_kv_heads, n_heads // n_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)
    out[token_rows] = o.reshape(n_seqs, n_heads, head_dim)
