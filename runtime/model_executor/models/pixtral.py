"""Pixtral's vision transformer (Mistral 3's tower, and Pixtral-12B's): each image at its own
size, a multiple of the patch size, never padded to a square. Its patches (a convolution whose
kernel is the patch) are RMS-normed and go through pre-norm blocks of attention and a SwiGLU
MLP, with no biases anywhere.

Position is a 2-D rotary: of a head's frequencies, the even-numbered turn by the patch's row and
the odd-numbered by its column (each set laid out as one half of the rotated pairs). Images
encoded together are one sequence whose attention is block-diagonal: a patch sees only its own
image's patches. Every rank holds the whole tower (replicated, as the other towers here)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from infernetes.runtime.model_executor.models.qwen_vision import rotate, segment_attention
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN

EPS = 1e-5  # the tower's norms (not in its config)


def image_grids(image_sizes: torch.Tensor, patch_size: int) -> list[tuple[int, int]]:
    """Each image's (rows, columns) of patches from its processed ``(height, width)``."""
    return [(h // patch_size, w // patch_size) for h, w in image_sizes.tolist()]


def placeholder_rows(
    embeds: torch.Tensor, ids: torch.Tensor, image_token_id: int, features: torch.Tensor
) -> torch.Tensor:
    """An image's rows for its placeholder grid ``ids``: ``embeds`` (the grid tokens' text
    embeddings) with ``features`` in place of its ``image_token_id`` ones, in order."""
    is_image = ids == image_token_id
    if int(is_image.sum()) != len(features):
        raise ValueError(
            f"an image of {len(features)} feature rows has {int(is_image.sum())} placeholder tokens"
        )
    embeds[is_image] = features.to(embeds.dtype)
    return embeds


class PixtralAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: Sequence[int]
    ) -> torch.Tensor:
        q, k, v = (
            proj(x).view(len(x), self.num_heads, -1)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return self.o_proj(segment_attention(q, k, v, bounds).reshape(len(x), -1))


class PixtralMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PixtralBlock(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, EPS)
        self.attention = PixtralAttention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, EPS)
        self.feed_forward = PixtralMLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: Sequence[int]
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, bounds)
        return x + self.feed_forward(self.ffn_norm(x))


class PixtralTransformer(nn.Module):
    def __init__(self, config: PretrainedConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PixtralBlock(config) for _ in range(num_layers))


def axial_frequencies(config: PretrainedConfig) -> torch.Tensor:
    """``[2, head_dim / 4]``: the frequencies rows turn by, and those columns turn by."""
    head_dim = config.hidden_size // config.num_attention_heads
    base = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    return torch.stack([inv_freq[0::2], inv_freq[1::2]])


class PixtralVisionTower(nn.Module):
    """``forward(pixel_values [B, C, H, W], grids, feature_layers)``: image ``i``'s top-left
    ``grids[i]`` patches (rows, columns; the rest is the batch's padding) encoded together,
    the hidden states after each of ``feature_layers`` (0: the normed patches, i: after layer
    i) as ``[patches of every image, hidden]``, image after image, row by row."""

    frequencies: torch.Tensor  # a buffer: it follows the module to its device

    def __init__(self, config: PretrainedConfig, num_layers: int) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.patch_conv = nn.Conv2d(
            config.num_channels, config.hidden_size, self.patch_size, self.patch_size, bias=False
        )
        self.ln_pre = RMSNorm(config.hidden_size, EPS)
        self.transformer = PixtralTransformer(config, num_layers)
        self.register_buffer("frequencies", axial_frequencies(config), persistent=False)

    def forward(
        self,
        pixel_values: torch.Tensor,
        grids: Sequence[tuple[int, int]],
        feature_layers: Sequence[int],
    ) -> list[torch.Tensor]:
        dtype = self.patch_conv.weight.dtype
        embedded = self.patch_conv(pixel_values.to(dtype))  # [B, hidden, rows, columns]
        x = torch.cat(
            [
                image[:, :rows, :columns].flatten(1).t()
                for image, (rows, columns) in zip(embedded, grids, strict=True)
            ]
        )
        cos, sin = self._rotary(grids, x.device)
        bounds = [0, *itertools.accumulate(rows * columns for rows, columns in grids)]
        x = self.ln_pre(x)
        states = [x]
        for layer in self.transformer.layers:
            x = layer(x, cos, sin, bounds)
            states.append(x)
        return [states[i] for i in feature_layers]

    def _rotary(
        self, grids: Sequence[tuple[int, int]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[patches, 1, head_dim]`` of each patch's (row, column) angles."""
        positions = torch.cat(
            [
                torch.cartesian_prod(torch.arange(rows), torch.arange(columns))
                for rows, columns in grids
            ]
        ).to(device)
        angles = (positions[..., None] * self.frequencies).flatten(1)  # [N, head_dim / 2]
        angles = torch.cat([angles, angles], dim=-1)[:, None]
        return angles.cos(), angles.sin()
