"""LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``): LLaVA-NeXT's anyres tiling over
a SigLIP tower and a Qwen2 language model, with one step more: an unpadded grid of more than
``vision_aspect_ratio``'s ``anyres_max_N`` tiles' worth of features (by over 10% in side) is
scaled down bilinearly to about N tiles' worth before the newline rows, as the processor counts
its placeholders. An image of a prompt with several is its base tile alone (and a newline row),
as transformers takes it. A video's frames each go through the tower and the projector, their
patch grids are pooled 2 x 2 (bilinearly, to half the side rounded up) and one newline row ends
the video."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.models.llava import LlavaForConditionalGeneration
from infernetes.runtime.model_executor.models.llava_next import LlavaNextForConditionalGeneration
from infernetes.runtime.multimodal.llava_onevision import (
    LlavaOnevisionVLProcessor,
    fitted_size,
    max_tiles,
    pooled_side,
)
from transformers import PretrainedConfig


class LlavaOnevisionForConditionalGeneration(LlavaNextForConditionalGeneration):
    hf_processor_class = LlavaOnevisionVLProcessor  # transformers' needs torchvision
    modalities = ("image", "video")

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__(config, max_position)
        self.max_tiles = max_tiles(config)

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Images as LLaVA-NeXT's, or, given their base tile alone (``pixel_values``
        [items, 1, C, H, W]: a prompt with several images), its rows and a newline row; videos
        from ``pixel_values_videos`` [items, frames, C, H, W]."""
        if modality == "video":
            return self._embed_videos(data["pixel_values_videos"])
        if modality == "image" and data["pixel_values"].shape[1] == 1:
            bases = LlavaForConditionalGeneration.embed_multimodal(
                self, "image", {"pixel_values": data["pixel_values"][:, 0]}
            )
            return [torch.cat([base, self.image_newline[None].to(base.dtype)]) for base in bases]
        return super().embed_multimodal(modality, data)

    def _embed_videos(self, videos: torch.Tensor) -> list[torch.Tensor]:
        items, frames = videos.shape[:2]
        rows = LlavaForConditionalGeneration.embed_multimodal(
            self, "image", {"pixel_values": videos.flatten(0, 1)}
        )
        p = self.patches
        grids = torch.stack(rows).unflatten(1, (p, p)).permute(0, 3, 1, 2)
        side = pooled_side(p)
        pooled = F.interpolate(grids, [side, side], mode="bilinear").permute(0, 2, 3, 1)
        pooled = pooled.reshape(items, frames * side * side, -1)
        newline = self.image_newline[None].to(pooled.dtype)
        return [torch.cat([video, newline]) for video in pooled]

    def fit(self, grid: torch.Tensor) -> torch.Tensor:
        rows, cols = grid.shape[1:]
        size = fitted_size(rows, cols, self.max_tiles, self.patches)
        if size == (rows, cols):
            return grid
        return F.interpolate(grid[None], list(size), mode="bilinear")[0]
