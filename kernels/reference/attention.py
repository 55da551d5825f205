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
    if cache.dtype in FP8_DTYPES:
        if scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        raw = cache.view(torch.uint8)[tables.long()].view(cache.dtype)
        blocks = (raw.float() * scale.float()).to(dtype)
    else:
        blocks = cache[tables.long()].to(dtype)
    return blocks.reshape(n_seqs, n_blocks * block_size, n_kv_heads, head_dim)


def _sdpa(q, k, v, mask, scale):
    """q `[B, H, Lq, D]`, k/v `[B, Hkv, Lk, D]`: grouped-query attention."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


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
    decodes = [b for b, n in enumerate(q_lens) if n == 1]
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
        # Query i sits at position kv_len - q_len + i and sees keys up to it.
        q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)
        mask = torch.arange(kv_len, device=query.device)[None, :] <= q_pos[:, None]
        out[starts[b] : starts[b + 1]] = _sdpa(q, k, v, mask, scale)[0].transpose(0, 1)
    return out


def _decode(query, k_cache, v_cache, block_tables, starts, lens, decodes, scale, k_scale, v_scale, out):
    device = query.device
    block_size = k_cache.shape[1]
    rows = torch.tensor(decodes, device=device)
    kv_lens = torch.tensor([lens[b] for b in decodes], device=device)
    n_blocks = -(-max(lens[b] for b in decodes) // block_size)
    tables = block_tables[rows, :n_blocks]
    valid = torch.arange(n_blocks * block_size, device=device)[None, :] < kv_lens[:, None]  # [Bd, L]
    # Slots past a sequence's end hold whatever the cache holds (NaN bit patterns included): zero
    # them, since a masked-out NaN still poisons the softmax and the weighted sum.
    keep = valid[:, :, None, None]
    k = gather_kv(k_cache, tables, k_scale, query.dtype).where(keep, 0).transpose(1, 2)
    v = gather_kv(v_cache, tables, v_scale, query.dtype).where(keep, 0).transpose(1, 2)
    token_rows = torch.tensor([starts[b] for b in decodes], device=device)
    q = query[token_rows].unsqueeze(2)  # [Bd, H, 1, D]
    out[token_rows] = _sdpa(q, k, v, valid[:, None, None, :], scale).squeeze(2)
