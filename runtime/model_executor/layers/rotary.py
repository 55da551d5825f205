"""Rotary position embedding: one cos/sin cache per model, applied by the kernels' op."""

from __future__ import annotations

from collections.abc import Mapping
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
    """One RotaryEmbedding shared by every layer with the same settings."""
    key = (
        head_dim,
        rotary_dim,
        max_position,
        base,
        tuple(sorted((k, str(v)) for k, v in (rope_scaling or {}).items())),
        max_position_embeddings,
        is_neox,
    )
    if key not in _cache:
        _cache[key] = RotaryEmbedding(
            head_dim, rotary_dim, max_position, base, rope_scaling, max_position_embeddings, is_neox
        )
    return _cache[key]


def rope_from_config(
    config: PretrainedConfig, layer_type: str | None = None
) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` from an HF config, old (``rope_scaling``) or new
    (transformers 5's ``rope_parameters``) spelling; scaling is None for the plain rope. A config
    that keeps one set per layer type (Gemma 3) gives ``layer_type``'s."""
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
    return float(base), (scaling if rope_type != "default" else None)
