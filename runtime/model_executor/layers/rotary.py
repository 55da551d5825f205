"""Rotary position embedding: one cos/sin cache per model, applied by the kernels' op; M-RoPE
(Qwen2-VL's multimodal rotary: ``rope_scaling.mrope_section``) rotates each section of the
frequencies by its own axis of a ``[3, T]`` position (temporal, height, width); Qwen3-VL's
(``mrope_interleaved``) deals the frequencies out to the axes in turn instead."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from infernetes.kernels import ops
from infernetes.kernels.rope import build_cos_sin_cache
from torch import nn
from transformers import PretrainedConfig


class RotaryEmbedding(nn.Module):
    cos_sin_cache: torch.Tensor  # a buffer: it follows the module to its device

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        rope_scaling: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
        is_neox: bool = True,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.is_neox = is_neox
        cache = build_cos_sin_cache(
            rotary_dim, max_position, base, rope_scaling, max_position_embeddings
        )
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, H*D]``, k ``[T, Hkv*D]`` flattened per token, as the projections produce them."""
        num_tokens = q.shape[0]
        q3 = q.view(num_tokens, -1, self.head_dim)
        k3 = k.view(num_tokens, -1, self.head_dim)
        q3, k3 = ops.rotary_embedding(positions, q3, k3, self.cos_sin_cache, self.is_neox)
        return q3.reshape(num_tokens, -1), k3.reshape(num_tokens, -1)


class MRotaryEmbedding(RotaryEmbedding):
    """M-RoPE: the rotary frequencies split into ``mrope_section`` (``[t, h, w]`` counts summing
    to half the rotary dim), each rotated by its axis of a ``[3, T]`` position. A ``[T]``
    position (every axis the same: text, and every decode step) is the plain rotary.

    Sections are runs of frequencies (Qwen2-VL), or with ``interleaved`` (Qwen3-VL) dealt out
    t, h, w, t, h, w, ...: frequency ``i`` turns by h when ``i % 3 == 1`` and ``i < 3 * h``, by
    w when ``i % 3 == 2`` and ``i < 3 * w``, else by t."""

    axis_of: torch.Tensor  # a buffer, [1, rotary_dim]

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        mrope_section: Sequence[int],
        is_neox: bool = True,
        interleaved: bool = False,
    ) -> None:
        super().__init__(head_dim, rotary_dim, max_position, base, None, None, is_neox)
        if len(mrope_section) != 3 or sum(mrope_section) != rotary_dim // 2:
            raise ValueError(
                f"rope_scaling.mrope_section: three counts summing to {rotary_dim // 2} (half "
                f"the rotary dim), got {list(mrope_section)}"
            )
        # the axis (0 t, 1 h, 2 w) each frequency turns by, for the cos half and the sin half
        axes = (
            _interleaved_axes(mrope_section)
            if interleaved
            else torch.repeat_interleave(torch.arange(3), torch.tensor(list(mrope_section)))
        )
        self.register_buffer("axis_of", torch.cat([axes, axes])[None], persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().forward(positions, q, k)
        # each token's own cos/sin row, taken axis by axis, then rotated as the plain rope
        rows = self.cos_sin_cache[positions]  # [3, T, rotary_dim]
        per_token = rows.gather(0, self.axis_of.expand(rows.shape[1], -1)[None]).squeeze(0)
        num_tokens = q.shape[0]
        q3 = q.view(num_tokens, -1, self.head_dim)
        k3 = k.view(num_tokens, -1, self.head_dim)
        order = torch.arange(num_tokens, device=positions.device)
        q3, k3 = ops.rotary_embedding(order, q3, k3, per_token, self.is_neox)
        return q3.reshape(num_tokens, -1), k3.reshape(num_tokens, -1)


def _interleaved_axes(mrope_section: Sequence[int]) -> torch.Tensor:
    """Each frequency's axis when the sections are dealt out in turn (Qwen3-VL's layout)."""
    _, h, w = mrope_section
    index = torch.arange(sum(mrope_section))
    axes = torch.zeros_like(index)
    axes[(index % 3 == 1) & (index < 3 * h)] = 1
    axes[(index % 3 == 2) & (index < 3 * w)] = 2
    return axes


_cache: dict[tuple, RotaryEmbedding] = {}


def get_rope(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None = None,
    max_position_embeddings: int | None = None,
    is_neox: bool = True,
) -> RotaryEmbedding:
    """One RotaryEmbedding shared by every layer with the same settings on the device models are
    being built on (a CPU model and a GPU one in a process, as the GPU smoke tests build them,
    must not share a cache)."""
    key = (
        str(torch.get_default_device()),
        head_dim,
        rotary_dim,
        max_position,
        base,
        tuple(sorted((k, str(v)) for k, v in (rope_scaling or {}).items())),
        max_position_embeddings,
        is_neox,
    )
    if key not in _cache and rope_scaling and "mrope_section" in rope_scaling:
        _cache[key] = MRotaryEmbedding(
            head_dim,
            rotary_dim,
            max_position,
            base,
            rope_scaling["mrope_section"],
            is_neox,
            bool(rope_scaling.get("mrope_interleaved", False)),
        )
    elif key not in _cache:
        _cache[key] = RotaryEmbedding(
            head_dim, rotary_dim, max_position, base, rope_scaling, max_position_embeddings, is_neox
        )
    return _cache[key]


def rope_from_config(
    config: PretrainedConfig, layer_type: str | None = None
) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` from an HF config, old (``rope_scaling``) or new
    (transformers 5's ``rope_parameters``) spelling; scaling is None for the plain rope, and
    kept for M-RoPE (an ``mrope_section``). A config that keeps one set per layer type
    (Gemma 3) gives ``layer_type``'s."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = scaling = dict(params[layer_type])
    else:
        scaling = dict(getattr(config, "rope_scaling", None) or {}) or params
    base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    original = getattr(config, "original_max_position_embeddings", None)
    if original and "original_max_position_embeddings" not in scaling:  # Phi-3 keeps it outside
        scaling["original_max_position_embeddings"] = original
    if rope_type == "mrope":  # older Qwen2-VL configs: M-RoPE over the default frequencies
        scaling["rope_type"] = "default"
        scaling.pop("type", None)
    keep = rope_type not in ("default", "mrope") or "mrope_section" in scaling
    return float(base), (scaling if keep else None)
