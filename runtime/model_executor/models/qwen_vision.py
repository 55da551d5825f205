"""The Qwen2-VL and Qwen2.5-VL vision transformers: images at their own resolution, as a run of
``temporal_patch_size x patch_size x patch_size`` patches (the processor's ``pixel_values``
rows, each merge block's ``merge x merge`` patches one after another) and the image's grid of
them (``image_grid_thw``).

A patch is embedded by a Conv3d whose kernel is the whole patch (so a matrix product), and
rotated in attention by a 2-D rotary: the first half of its frequencies by the patch's row, the
second by its column. Attention never crosses a frame. The merger norms each patch and
projects each merge block's patches, concatenated, to one row of the language model.

Qwen2-VL's blocks are LayerNorm with a ``fc1``/``fc2`` MLP. Qwen2.5-VL's are RMSNorm with a
SwiGLU MLP, and attend within windows of ``window_size`` pixels square except the
``fullatt_block_indexes`` blocks: its patches are put in window order (merge block by merge
block) before the blocks and back after the merger."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN

Grid = tuple[int, int, int]  # (frames, patch rows, patch columns) of one image


def is_windowed(config: PretrainedConfig) -> bool:
    """Qwen2.5-VL's tower (window attention, RMSNorm, SwiGLU) rather than Qwen2-VL's."""
    return hasattr(config, "fullatt_block_indexes")


def _widths(config: PretrainedConfig) -> tuple[int, int]:
    """(the tower's width, the language model's): the configs name them differently."""
    if is_windowed(config):
        return config.hidden_size, config.out_hidden_size
    return config.embed_dim, config.hidden_size


def _norm(config: PretrainedConfig, width: int) -> nn.Module:
    return RMSNorm(width, 1e-6) if is_windowed(config) else nn.LayerNorm(width, eps=1e-6)


def patch_positions(grids: Sequence[Grid], merge: int) -> torch.Tensor:
    """``[patches, 2]``: each patch's (row, column) in its image, in the processor's order
    (merge block by merge block, frame after frame)."""
    rows = []
    for t, h, w in grids:
        row, column = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        blocks = (h // merge, merge, w // merge, merge)
        row = row.reshape(blocks).transpose(1, 2).flatten()
        column = column.reshape(blocks).transpose(1, 2).flatten()
        rows.append(torch.stack([row, column], dim=-1).repeat(t, 1))
    return torch.cat(rows)


def frame_bounds(grids: Sequence[Grid]) -> list[int]:
    """The patch offsets where each frame starts, and the end: full attention's segments."""
    sizes = [h * w for t, h, w in grids for _ in range(t)]
    return [0, *itertools.accumulate(sizes)]


def window_order(grids: Sequence[Grid], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows of ``window x window`` merge blocks (fewer at the right and bottom
    edges), row by row in each frame: the merge blocks in window order, and the patch offsets
    where each window starts, and the end."""
    order, bounds, first = [], [0], 0
    unit = merge * merge
    for t, h, w in grids:
        rows, columns = h // merge, w // merge
        blocks = torch.arange(t * rows * columns).reshape(t, rows, columns) + first
        for frame in blocks:
            for top in range(0, rows, window):
                for left in range(0, columns, window):
                    cells = frame[top : top + window, left : left + window].flatten()
                    order.append(cells)
                    bounds.append(bounds[-1] + len(cells) * unit)
        first += t * rows * columns
    return torch.cat(order), bounds


def segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: Sequence[int]
) -> torch.Tensor:
    """Attention of ``[N, heads, head_dim]`` rows within each segment ``bounds`` marks, not
    across: one batched call per segment length."""
    out = torch.empty_like(q)
    starts: dict[int, list[int]] = defaultdict(list)
    for start, end in itertools.pairwise(bounds):
        starts[end - start].append(start)
    for length, firsts in starts.items():
        rows = torch.tensor(firsts, device=q.device)[:, None] + torch.arange(
            length, device=q.device
        )
        qs, ks, vs = (x[rows].transpose(1, 2) for x in (q, k, v))  # [segments, heads, L, D]
        out[rows] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2)
    return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary over the whole head (halves rotated), in float32 as transformers does."""
    dtype, x = x.dtype, x.float()
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-second, first], dim=-1) * sin).to(dtype)


def rotary_inv_freq(config: PretrainedConfig, width: int) -> torch.Tensor:
    """The 2-D rotary's frequencies: a quarter of the head's width, turned by the row in one
    half of the head and by the column in the other."""
    base = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    half = width // config.num_heads // 2
    return 1.0 / (base ** (torch.arange(0, half, 2, dtype=torch.float) / half))


def rotary_cos_sin(
    grids: Sequence[Grid], merge: int, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, 1, head_dim]`` cos and sin of each patch's (row, column) angles."""
    angles = patch_positions(grids, merge).to(inv_freq.device)[..., None] * inv_freq
    angles = torch.cat([angles.flatten(1)] * 2, dim=-1)[:, None]
    return angles.cos(), angles.sin()


class VisionAttention(nn.Module):
    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: Sequence[int]
    ) -> torch.Tensor:
        q, k, v = self.qkv(x).view(len(x), 3, self.num_heads, -1).unbind(1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return self.proj(segment_attention(q, k, v, bounds).reshape(len(x), -1))


class VisionMLP(nn.Module):
    """Qwen2-VL's: ``fc2(act(fc1(x)))``."""

    def __init__(self, width: int, hidden: int, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = ACT2FN[act]
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionGatedMLP(nn.Module):
    """Qwen2.5-VL's: ``down(act(gate(x)) * up(x))``, with biases."""

    def __init__(self, width: int, hidden: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden)
        self.up_proj = nn.Linear(width, hidden)
        self.act = ACT2FN[act]
        self.down_proj = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width, _ = _widths(config)
        self.norm1 = _norm(config, width)
        self.attn = VisionAttention(width, config.num_heads)
        self.norm2 = _norm(config, width)
        self.mlp: nn.Module = (
            VisionGatedMLP(width, config.intermediate_size, config.hidden_act)
            if is_windowed(config)
            else VisionMLP(width, int(width * config.mlp_ratio), config.hidden_act)
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: Sequence[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, config: PretrainedConfig, width: int, bias: bool = False) -> None:
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, width, kernel, kernel, bias=bias)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # the kernel covers the whole patch: the convolution is one matrix product
        weight = self.proj.weight
        return F.linear(patches.to(weight.dtype), weight.flatten(1), self.proj.bias)


class PatchMerger(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width, out = _widths(config)
        self.merged = width * config.spatial_merge_size**2
        self.ln_q = _norm(config, width)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged, self.merged), nn.GELU(), nn.Linear(self.merged, out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.merged))


class QwenVisionTransformer(nn.Module):
    """``forward(patches [N, C * t * p * p], grids)`` -> ``[N / merge**2, LM hidden]``: the
    images' rows for the language model, image after image."""

    inv_freq: torch.Tensor  # a buffer: it follows the module to its device

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        width, _ = _widths(config)
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, width)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        self.register_buffer("inv_freq", rotary_inv_freq(config, width), persistent=False)
        self.windowed = is_windowed(config)
        if self.windowed:
            self.full_blocks = set(config.fullatt_block_indexes)
            self.window = config.window_size // self.merge // config.patch_size

    def forward(self, patches: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        x = self.patch_embed(patches)
        cos, sin = rotary_cos_sin(grids, self.merge, self.inv_freq)
        frames = frame_bounds(grids)
        windows, order = frames, None
        if self.windowed:
            order, windows = window_order(grids, self.merge, self.window)
            x, cos, sin = (self._in_blocks(y, order) for y in (x, cos, sin))
        for i, block in enumerate(self.blocks):
            full = not self.windowed or i in self.full_blocks
            x = block(x, cos, sin, frames if full else windows)
        merged = self.merger(x)
        return merged if order is None else merged[torch.argsort(order.to(merged.device))]

    def _in_blocks(self, rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """``rows`` (one a patch) taken merge block by merge block in ``order``."""
        unit = self.merge * self.merge
        blocks = rows.reshape(len(rows) // unit, unit, *rows.shape[1:])
        return blocks[order.to(rows.device)].reshape(rows.shape)
