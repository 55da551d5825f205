"""Random paged-attention inputs and a plain per-token oracle, for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from infernetes.kernels.reference.fp8 import FP8_DTYPES, quantize_to_fp8


@dataclass
class PagedBatch:
    """The arguments of `ops.paged_attention` for one random batch."""

    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def args(self) -> tuple:
        return (
            self.query,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.cu_seqlens_q,
            self.seq_lens,
            self.scale,
            self.k_scale,
            self.v_scale,
        )


def random_paged_batch(
    q_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    extra_blocks: int = 3,
) -> PagedBatch:
    """Sequences whose cache blocks are scattered at random over a cache with spare blocks;
    block-table entries past a sequence's end point at spare blocks (`extra_blocks` >= 1) that no
    sequence owns, as stale entries do in the engine."""
    gen = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + extra_blocks
    order = torch.randperm(num_blocks, generator=gen)
    spare = order[sum(blocks_per_seq) :]
    tables = spare[torch.randint(0, len(spare), (len(seq_lens), max_blocks), generator=gen)]
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = order[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    k_scale = v_scale = None
    if cache_dtype in FP8_DTYPES:
        k_scale = torch.tensor(k.abs().max().item() / 200.0)
        v_scale = torch.tensor(v.abs().max().item() / 200.0)
        k_cache, v_cache = (
            quantize_to_fp8(k, k_scale, cache_dtype),
            quantize_to_fp8(v, v_scale, cache_dtype),
        )
        k_scale, v_scale = k_scale.to(device), v_scale.to(device)
    else:
        k_cache, v_cache = k.to(cache_dtype), v.to(cache_dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype)
    return PagedBatch(
        query=query.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=tables.to(torch.int32).to(device),
        cu_seqlens_q=cu.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        scale=head_dim**-0.5,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def _dequant(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    x = cache.double()
    return x * scale.double() if scale is not None else x


def naive_paged_attention(
    batch: PagedBatch,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    images: list[list[tuple[int, int]]] | None = None,
) -> torch.Tensor:
    """Token by token in float64: the oracle the reference and the kernels are checked against.
    ``images``: per sequence, ``(start, end)`` position ranges whose tokens see the whole range
    (Gemma 3's images)."""
    k_all, v_all = _dequant(batch.k_cache, batch.k_scale), _dequant(batch.v_cache, batch.v_scale)
    block_size, num_kv_heads = batch.k_cache.shape[1], batch.k_cache.shape[2]
    group = batch.query.shape[1] // num_kv_heads
    out = torch.empty(batch.query.shape, dtype=torch.float64, device=batch.query.device)
    cu = batch.cu_seqlens_q.tolist()
    for b, kv_len in enumerate(batch.seq_lens.tolist()):
        slots = [
            int(batch.block_tables[b, j // block_size]) * block_size + j % block_size
            for j in range(kv_len)
        ]
        k = k_all.view(-1, num_kv_heads, k_all.shape[-1])[slots]  # [L, Hkv, D]
        v = v_all.view(-1, num_kv_heads, v_all.shape[-1])[slots]
        q_len = cu[b + 1] - cu[b]
        for i in range(q_len):
            pos = kv_len - q_len + i
            q = batch.query[cu[b] + i].double()  # [H, D]
            first = max(pos + 1 - sliding_window, 0) if sliding_window else 0
            spans = images[b] if images else []
            last = max([pos, *(end - 1 for start, end in spans if start <= pos < end)])
            kk = k[first : last + 1].repeat_interleave(group, dim=1)  # [P, H, D]
            vv = v[first : last + 1].repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,phd->hp", q, kk) * batch.scale
            if softcap:
                scores = torch.tanh(scores / softcap) * softcap
            if sinks is not None:  # one more logit per head, whose weight is dropped
                scores = torch.cat([scores, sinks.double().view(-1, 1)], dim=-1)
                probs = scores.softmax(-1)[:, :-1]
            else:
                probs = scores.softmax(-1)
            out[cu[b] + i] = torch.einsum("hp,phd->hd", probs, vv)
    return out
