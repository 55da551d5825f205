"""Batched LoRA, one adapter per token (punica's BGMV): the torch reference.

A step's tokens may each use a different adapter, or none. The adapters' weights sit in stacked
slots: ``a_stack`` ``[slots, R, K]`` (the down projections, "shrink") and ``b_stack``
``[slots, N, R]`` (the up projections, "expand", with the adapter's scaling already folded in).
``indices`` ``[T]`` gives each token's slot, ``-1`` for the base model alone.

Here every token is multiplied with every slot at once and the other slots' results are masked
to zero: two dense products of width ``slots * R`` (small next to the layer itself), no
per-slot grouping, no host synchronisation. It is also the CPU path.
"""

from __future__ import annotations

import torch


def _one_hot(indices: torch.Tensor, slots: int, dtype: torch.dtype) -> torch.Tensor:
    """``[T, slots]``: 1 at each token's slot; a row of zeros for index ``-1``."""
    return (indices[:, None] == torch.arange(slots, device=indices.device)).to(dtype)


def lora_shrink(x: torch.Tensor, a_stack: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x[t] @ a_stack[indices[t]].T`` for every token: ``x`` ``[T, K]`` -> ``[T, R]`` (zeros
    for tokens with index ``-1``)."""
    slots, rank, _ = a_stack.shape
    every_slot = (x @ a_stack.reshape(slots * rank, -1).T).view(-1, slots, rank)
    return (every_slot * _one_hot(indices, slots, x.dtype)[:, :, None]).sum(dim=1)


def lora_expand(
    s: torch.Tensor, b_stack: torch.Tensor, indices: torch.Tensor, out: torch.Tensor, offset: int
) -> None:
    """Add ``s[t] @ b_stack[indices[t]].T`` to ``out[t, offset : offset + N]`` in place: ``s``
    ``[T, R]``, ``b_stack`` ``[slots, N, R]``; tokens with index ``-1`` add zeros."""
    slots, width, _ = b_stack.shape
    routed = s[:, None, :] * _one_hot(indices, slots, s.dtype)[:, :, None]  # [T, slots, R]
    delta = torch.einsum("tlr,lnr->tn", routed, b_stack)
    out.narrow(1, offset, width).add_(delta.to(out.dtype))
