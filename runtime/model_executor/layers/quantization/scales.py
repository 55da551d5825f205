"""Scales of one strategy spread over a ``[N, K]`` weight (shared by the fp8, int8 and
compressed-tensors formats)."""

from __future__ import annotations

import torch


def per_block(scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """``[ceil(N / bn), ceil(K / bk)]`` block scales -> ``[N, K]``."""
    n, k = shape
    return scale.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]


def per_group(scale: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """``[N, G]`` group scales -> ``[N, K]`` by each input feature's group."""
    return scale.float()[:, g_idx.long()]


def per_tensor_or_channel(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """One scale, or one per output row (``[N]`` or ``[N, 1]``) -> broadcastable ``[N or 1, 1]``."""
    return scale.float().reshape(-1, 1) if scale.numel() == rows else scale.float().reshape(1, 1)
