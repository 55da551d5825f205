"""Rotary position embedding applied from a precomputed cos/sin cache.

`cos_sin_cache` is `[max_position, rotary_dim]`: cos of the rotary_dim/2 frequencies, then sin.
Only the first `rotary_dim` features of each head rotate (partial rotary); the rest pass through.
neox style rotates the two halves of those features, GPT-J style the even/odd pairs. The math runs
in the input dtype, with cos/sin cast to it, as transformers does.
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    rot_dim = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    if is_neox:
        x1, x2 = x_rot.chunk(2, dim=-1)
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    rotated = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.shape[-1] else rotated


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query `[T, H, D]`, key `[T, Hkv, D]`, positions `[T]` -> rotated copies."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q = _rotate(query, cos.to(query.dtype), sin.to(query.dtype), is_neox)
    k = _rotate(key, cos.to(key.dtype), sin.to(key.dtype), is_neox)
    return q, k
