"""The Qwen3-VL vision transformer: Qwen2-VL's (``qwen_vision.py``: patches at the image's own
resolution, 2-D rotary, attention within each frame, a merger of each ``merge x merge`` block)
with three changes:

- a learned ``num_position_embeddings`` grid of position embeddings (square), resized to each
  image's grid of patches (bilinear, corners aligned) and added to the patch embeddings;
- LayerNorm blocks with a ``linear_fc1``/``linear_fc2`` MLP, a patch embedding with a bias;
- DeepStack: the output of each block named in ``deepstack_visual_indexes`` goes through its
  own merger (normed after the merge block's patches are concatenated), and the language model
  adds those rows to its first decoder layers' hidden states at the image's tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.models.qwen_vision import (
    Grid,
    PatchEmbed,
    VisionAttention,
    frame_bounds,
    rotary_cos_sin,
    rotary_inv_freq,
)
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN


class Qwen3VisionMLP(nn.Module):
    """``linear_fc2(act(linear_fc1(x)))``."""

    def __init__(self, width: int, hidden: int, act: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(width, hidden)
        self.act = ACT2FN[act]
        self.linear_fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class Qwen3VisionBlock(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width = config.hidden_size
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = VisionAttention(width, config.num_heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Qwen3VisionMLP(width, config.intermediate_size, config.hidden_act)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: Sequence[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class Qwen3PatchMerger(nn.Module):
    """Each merge block's patches, concatenated, to one row of the language model; normed patch
    by patch (the final merger) or after concatenating (``after_merge``: DeepStack's)."""

    def __init__(self, config: PretrainedConfig, after_merge: bool) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.spatial_merge_size**2
        self.after_merge = after_merge
        self.norm = nn.LayerNorm(self.merged if after_merge else config.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.act_fn = nn.GELU()
        self.linear_fc2 = nn.Linear(self.merged, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.merged)) if self.after_merge else self.norm(x)
        return self.linear_fc2(self.act_fn(self.linear_fc1(x.view(-1, self.merged))))


class Qwen3VisionTransformer(nn.Module):
    """``forward(patches [N, C * t * p * p], grids)`` -> ``[N / merge**2, LM hidden * (1 +
    deepstack layers)]``: each merged row, then its DeepStack rows, image after image."""

    inv_freq: torch.Tensor  # a buffer: it follows the module to its device

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width = config.hidden_size
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, width, bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, width)
        self.side = int(config.num_position_embeddings**0.5)  # the learned grid's
        self.blocks = nn.ModuleList(Qwen3VisionBlock(config) for _ in range(config.depth))
        self.merger = Qwen3PatchMerger(config, after_merge=False)
        self.deepstack_visual_indexes = list(config.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(
            Qwen3PatchMerger(config, after_merge=True) for _ in self.deepstack_visual_indexes
        )
        self.register_buffer("inv_freq", rotary_inv_freq(config, width), persistent=False)

    def forward(self, patches: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        x = self.patch_embed(patches)
        x = x + self.position_embeddings(grids).to(x.dtype)
        cos, sin = rotary_cos_sin(grids, self.merge, self.inv_freq)
        frames = frame_bounds(grids)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames)
            if i in self.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)]
                deepstack.append(merger(x))
        return torch.cat([self.merger(x), *deepstack], dim=-1)

    def position_embeddings(self, grids: Sequence[Grid]) -> torch.Tensor:
        """``[N, width]``: the learned grid resized to each image's ``h x w`` patches, in the
        patches' order (merge block by merge block, the same for every frame)."""
        table = self.pos_embed.weight.float().view(self.side, self.side, -1).permute(2, 0, 1)
        rows = []
        for t, h, w in grids:
            resized = F.interpolate(table[None], (h, w), mode="bilinear", align_corners=True)[0]
            m = self.merge
            blocks = resized.permute(1, 2, 0).reshape(h // m, m, w // m, m, -1).transpose(1, 2)
            rows.append(blocks.reshape(h * w, -1).repeat(t, 1))
        return torch.cat(rows)
