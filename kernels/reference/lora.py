"""Batched LoRA, one adapter per token (punica's BGMV): the torch reference.

A step's tokens may each use a different adapter, or none. The adapters' weights sit in stacked
slots: ``a_stack`` ``[slots, R, K]`` (the down projections, "shrink") and ``b_stack``
``[slots, N, R]`` (the up projections, "expand", with the adapter's scaling already folded in).
``indices`` ``[T]`` gives each token's slot, ``-1`` for the base model alone. Here the tokens are
grouped by slot and each group is one matrix product, which is also the fast way on a CPU.
"""

from __future__ import annotations

import torch


def _groups(indices: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(slot, rows) for every slot used by some token; tokens without an adapter are left out."""
    return [
        (slot, (indices == slot).nonzero().squeeze(1))
        for slot in indices.unique().tolist()
        if slot >= 0
    ]


def lora_shrink(x: torch.Tensor, a_stack: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x[t] @ a_stack[indices[t]].T`` for every token: ``x`` ``[T, K]`` -> ``[T, R]`` (zeros
    for tokens with index ``-1``)."""
    out = x.new_zeros(x.shape[0], a_stack.shape[1])
    for slot, rows in _groups(indices):
        out[rows] = x[rows] @ a_stack[slot].T
    return out


def lora_expand(
    s: torch.Tensor, b_stack: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, offset: int
) -> None:
    """Add ``s[t] @ b_stack[indices[t]].T`` to ``out[t, offset : offset + N]`` in place: ``s``
    ``[T, R]``, ``b_stack`` ``[slots, N, R]``; tokens with index ``-1`` are left untouched."""
    columns = out.narrow(1, offset, b_stack.shape[1])
    for slot, rows in _groups(indices):
        columns.index_add_(0, rows, (s[rows] @ b_stack[slot].T).to(out.dtype))
