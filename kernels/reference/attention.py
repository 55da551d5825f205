"""Attention over the paged KV cache with torch's scaled_dot_product_attention.

Decode rows (one query token) of a batch go through one batched call with a padding mask; each
prefill or chunked-prefill sequence gets its own call with a causal mask shifted by its cached
prefix. The block tables are read on the host: this is the CPU path.

What depends only on the step's metadata (slot indices, masks, which rows decode) is worked out
once per step, not once per layer: every layer of a step passes the same metadata tensors, and on
a small, shared CPU those dozens of little index ops cost more than the attention itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from infernetes.kernels.reference.fp8 import FP8_DTYPES


def attend(q, k, v, mask, scale, softcap=None, sinks=None):
    """Softmax attention; `mask` True where a key is visible (None: plain causal). With
    `softcap`, scores become `softcap * tanh(scores / softcap)` before the softmax (Gemma 2);
    `sinks` (broadcast to the scores' rows) are one more logit per head in the softmax's
    denominator with no value (gpt-oss). Torch's fused attention does neither: written out."""
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale
        )
    scores = (q @ k.transpose(-1, -2)).float() * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = scores.softmax(dim=-1)
    else:
        sink = sinks.float().expand(*scores.shape[:-1], 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return (probs.to(v.dtype) @ v).to(q.dtype)


def _prefill_mask(plan: _PrefillPlan, sliding_window: int | None) -> torch.Tensor | None:
    """The plan's causal mask, narrowed to the last `sliding_window` positions of each query."""
    kv_len, q_len = plan.slots.shape[0], plan.end - plan.start
    if not sliding_window or kv_len <= sliding_window:
        return plan.mask
    pos = torch.arange(kv_len, device=plan.slots.device)
    q_pos = pos[kv_len - q_len :, None]
    return (pos[None, :] <= q_pos) & (pos[None, :] > q_pos - sliding_window)


def _prefill(q, k, v, mask, scale, softcap=None, sinks=None):
    """q `[1, H, Lq, D]`, k/v `[1, Hkv, Lk, D]`; `mask` None means plain causal."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return attend(q, k, v, mask, scale, softcap, None if sinks is None else sinks.view(1, -1, 1, 1))


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
) -> torch.Tensor:
    out = torch.empty_like(query)
    plan = step_plan(block_tables, cu_seqlens_q, seq_lens, k_cache.shape[1])
    if plan.padding_rows is not None:  # padding rows: nothing to attend to
        out[plan.padding_rows] = 0
    for group in plan.decode_groups:
        _decode(
            query,
            k_cache,
            v_cache,
            group,
            scale,
            k_scale,
            v_scale,
            out,
            sliding_window,
            softcap,
            sinks,
        )
    attend_prefills(
        query, k_cache, v_cache, plan, scale, k_scale, v_scale, out, sliding_window, softcap, sinks
    )
    return out


def attend_prefills(
    query,
    k_cache,
    v_cache,
    plan: _StepPlan,
    scale,
    k_scale,
    v_scale,
    out,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """The rows of prefill and chunked-prefill sequences of `plan`, written into `out`."""
    for seq in plan.prefills:
        k = _gather_tokens(k_cache, seq.slots, k_scale, query.dtype).transpose(0, 1).unsqueeze(0)
        v = _gather_tokens(v_cache, seq.slots, v_scale, query.dtype).transpose(0, 1).unsqueeze(0)
        q = query[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
        mask = _prefill_mask(seq, sliding_window)
        out[seq.start : seq.end] = _prefill(q, k, v, mask, scale, softcap, sinks)[0].transpose(0, 1)


def attend_within_images(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    spans: list[tuple[int, int, int, int, int]],
    scale: float,
    out: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Attend again the rows of image tokens that see their whole image (Gemma 3), into `out`.
    A span `(seq, first_row, end_row, first_position, image_end)`: query rows
    `first_row:end_row` of sequence `seq`, at positions from `first_position`, see every key
    before `image_end` (within `sliding_window` of the query when given). The image's keys are
    in the cache already: a step stores all its keys before any query attends."""
    block_size = k_cache.shape[1]
    for seq, start, end, first, image_end in spans:
        pos = torch.arange(image_end, device=query.device)
        tables = block_tables[seq, : -(-image_end // block_size)].long()
        slots = tables[pos // block_size] * block_size + pos % block_size
        k = _gather_tokens(k_cache, slots, k_scale, query.dtype).transpose(0, 1).unsqueeze(0)
        v = _gather_tokens(v_cache, slots, v_scale, query.dtype).transpose(0, 1).unsqueeze(0)
        q = query[start:end].transpose(0, 1).unsqueeze(0)
        q_pos = torch.arange(first, first + end - start, device=query.device)[:, None]
        mask = pos[None, :] > (q_pos - sliding_window if sliding_window else -1)
        out[start:end] = _prefill(q, k, v, mask, scale, softcap)[0].transpose(0, 1)


@dataclass
class _DecodePlan:
    """Decode rows of similar lengths, attended in one batched call."""

    token_rows: torch.Tensor  # [Bd] rows of the query
    slots: torch.Tensor  # [Bd * L] cache slots, L the longest of them
    valid: torch.Tensor  # [Bd, 1, 1, L] which of those slots belong to the sequence
    longest: int


@dataclass
class _PrefillPlan:
    """One prefill or chunked-prefill sequence: query rows start:end over the cache slots."""

    start: int
    end: int
    slots: torch.Tensor  # [kv_len]
    mask: torch.Tensor | None  # None: plain causal (no cached prefix)


@dataclass
class _StepPlan:
    padding_rows: torch.Tensor | None
    decode_rows: torch.Tensor | None  # [Bd] int32 query rows of the decode sequences
    decode_seqs: torch.Tensor | None  # [Bd] int32 their batch indices
    prefills: list[_PrefillPlan]
    # For the dense decode path, built on first use (a native decode kernel never needs them).
    _block_tables: torch.Tensor
    _starts: list[int]
    _lens: list[int]
    _block_size: int
    _decode_groups: list[_DecodePlan] | None = None

    @property
    def decode_groups(self) -> list[_DecodePlan]:
        if self._decode_groups is None:
            decodes = [] if self.decode_seqs is None else self.decode_seqs.tolist()
            self._decode_groups = [
                _decode_plan(self._block_tables, self._starts, self._lens, group, self._block_size)
                for group in _by_length(decodes, self._lens)
            ]
        return self._decode_groups


# The last step's metadata tensors (held, so their ids cannot be reused) and lists, and its plan.
_last_plan: tuple[tuple, list[int], list[int], _StepPlan] | None = None


def step_plan(block_tables, cu_seqlens_q, seq_lens, block_size: int) -> _StepPlan:
    """The plan of a step, worked out once and reused by every layer that passes the same metadata."""
    global _last_plan
    starts = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    key = (block_tables, cu_seqlens_q, seq_lens, block_size)
    if _last_plan is not None:
        last_key, last_starts, last_lens, plan = _last_plan
        if (
            all(a is b for a, b in zip(key[:3], last_key[:3], strict=True))
            and last_key[3] == block_size
            and last_starts == starts
            and last_lens == lens
        ):
            return plan
    plan = _make_plan(block_tables, starts, lens, block_size)
    _last_plan = (key, starts, lens, plan)
    return plan


def _make_plan(
    block_tables: torch.Tensor, starts: list[int], lens: list[int], block_size: int
) -> _StepPlan:
    device = block_tables.device
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    padding = [starts[b] for b, n in enumerate(q_lens) if n == 1 and lens[b] == 0]
    decodes = [b for b, n in enumerate(q_lens) if n == 1 and lens[b] > 0]
    prefills = []
    for b, q_len in enumerate(q_lens):
        if q_len <= 1:
            continue
        kv_len = lens[b]
        pos = torch.arange(kv_len, device=device)
        tables = block_tables[b, : -(-kv_len // block_size)].long()
        slots = tables[pos // block_size] * block_size + pos % block_size
        mask = None  # no cached prefix: plain causal
        if kv_len > q_len:  # query i sits at position kv_len - q_len + i and sees keys up to it
            mask = pos[None, :] <= pos[kv_len - q_len :, None]
        prefills.append(_PrefillPlan(starts[b], starts[b + 1], slots, mask))
    return _StepPlan(
        padding_rows=torch.tensor(padding, device=device) if padding else None,
        decode_rows=torch.tensor([starts[b] for b in decodes], dtype=torch.int32, device=device)
        if decodes
        else None,
        decode_seqs=torch.tensor(decodes, dtype=torch.int32, device=device) if decodes else None,
        prefills=prefills,
        _block_tables=block_tables,
        _starts=starts,
        _lens=lens,
        _block_size=block_size,
    )


DECODE_GROUP_ROWS = 16


def _by_length(decodes: list[int], lens: list[int]) -> list[list[int]]:
    """Decode rows sorted by length in groups of DECODE_GROUP_ROWS: each group pads only to its own
    longest sequence, so the gather and the attention read far fewer padding slots (the decode
    step is memory bound on a CPU)."""
    ordered = sorted(decodes, key=lambda b: lens[b])
    return [ordered[i : i + DECODE_GROUP_ROWS] for i in range(0, len(ordered), DECODE_GROUP_ROWS)]


def _decode_plan(block_tables, starts, lens, decodes, block_size) -> _DecodePlan:
    device = block_tables.device
    kv_lens = torch.tensor([lens[b] for b in decodes], device=device)
    longest = max(lens[b] for b in decodes)
    tables = block_tables[torch.tensor(decodes, device=device), : -(-longest // block_size)].long()
    # Gather by slot. Positions past a sequence's end read its first token instead of whatever the
    # cache holds there (stale or NaN bit patterns): masked out, a finite value weighs exactly zero,
    # while a NaN would still poison the softmax and the weighted sum.
    pos = torch.arange(longest, device=device)
    valid = pos[None, :] < kv_lens[:, None]  # [Bd, L]
    slots = tables[:, pos // block_size] * block_size + pos % block_size
    slots = torch.where(valid, slots, slots[:, :1]).reshape(-1)
    token_rows = torch.tensor([starts[b] for b in decodes], device=device)
    return _DecodePlan(token_rows, slots, valid[:, None, None, :], longest)


def take_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`table.index_select(0, rows)`, copying the rows as 4-byte words when their size allows:
    torch's CPU index_select has a vectorised copy for float32 but a slow per-element loop for
    bf16/fp16/fp8 (10x slower here). A bit-for-bit copy either way."""
    if table.dtype != torch.float32 and table[0].numel() * table.element_size() % 4 == 0:
        words = table.reshape(table.shape[0], -1).view(torch.float32)
        return words.index_select(0, rows).view(table.dtype).view(-1, *table.shape[1:])
    return table.index_select(0, rows)


def _gather_tokens(
    cache: torch.Tensor, slots: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """The tokens at `slots` `[N]` (slot = block * block_size + offset) as `[N, Hkv, D]` in `dtype`."""
    flat = cache.view(-1, *cache.shape[2:])
    if cache.dtype in FP8_DTYPES:
        if scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        raw = take_rows(flat.view(torch.uint8), slots).view(cache.dtype)
        return (raw.float() * scale.float()).to(dtype)
    return take_rows(flat, slots).to(dtype)


def _decode(
    query,
    k_cache,
    v_cache,
    plan: _DecodePlan,
    scale,
    k_scale,
    v_scale,
    out,
    sliding_window=None,
    softcap=None,
    sinks=None,
):
    n_kv_heads, head_dim = k_cache.shape[2:]
    n_seqs, n_heads = plan.token_rows.shape[0], query.shape[1]
    k = _gather_tokens(k_cache, plan.slots, k_scale, query.dtype)
    v = _gather_tokens(v_cache, plan.slots, v_scale, query.dtype)
    k = k.view(n_seqs, plan.longest, n_kv_heads, head_dim).transpose(1, 2)
    v = v.view(n_seqs, plan.longest, n_kv_heads, head_dim).transpose(1, 2)
    # GQA without copying K/V per query head: the heads sharing a kv head become that kv head's
    # query rows (one query token each, so one mask serves them all).
    q = query.index_select(0, plan.token_rows).view(
        n_seqs, n_kv_heads, n_heads // n_kv_heads, head_dim
    )
    valid = plan.valid
    if sliding_window and plan.longest > sliding_window:  # only the last sliding_window keys
        kv_lens = valid.sum(dim=-1, keepdim=True)
        pos = torch.arange(plan.longest, device=valid.device)
        valid = valid & (pos >= kv_lens - sliding_window)
    if sinks is not None:  # the query rows are (kv head, head in its group)
        sinks = sinks.view(1, n_kv_heads, n_heads // n_kv_heads, 1)
    o = attend(q, k, v, valid, scale, softcap, sinks)
    out[plan.token_rows] = o.reshape(n_seqs, n_heads, head_dim)
