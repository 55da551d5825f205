"""LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``): LLaVA-NeXT's anyres tiling over
a SigLIP tower and a Qwen2 language model, with one step more: an unpadded grid of more than
``vision_aspect_ratio``'s ``anyres_max_N`` tiles' worth of features (by over 10% in side) is
scaled down bilinearly to about N tiles' worth before the newline rows, as the processor counts
its placeholders. Images only: videos are planned."""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.models.llava_next import LlavaNextForConditionalGeneration
from transformers import PretrainedConfig

ASPECT_RATIO = re.compile(r"anyres_max_(\d+)")


def max_tiles(config: PretrainedConfig) -> int:
    """N of the config's ``vision_aspect_ratio`` ``anyres_max_N``."""
    value = getattr(config, "vision_aspect_ratio", "anyres_max_9")
    match = ASPECT_RATIO.fullmatch(str(value))
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"vision_aspect_ratio: 'anyres_max_N' with N of 1 or more, got {value!r}")
    return int(match.group(1))


class LlavaOnevisionForConditionalGeneration(LlavaNextForConditionalGeneration):
    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__(config, max_position)
        self.max_tiles = max_tiles(config)

    def fit(self, grid: torch.Tensor) -> torch.Tensor:
        rows, cols = grid.shape[1:]
        ratio = math.sqrt(rows * cols / (self.max_tiles * self.patches**2))
        if ratio <= 1.1:
            return grid
        size = [int(rows // ratio), int(cols // ratio)]
        return F.interpolate(grid[None], size, mode="bilinear")[0]
