"""LLaVA-NeXT (``LlavaNextForConditionalGeneration``): LLaVA with anyres tiling. The processor
resizes an image to the best of ``image_grid_pinpoints`` for its size, cuts that into tiles of
the tower's input size and puts a base tile of the whole image first. Every tile goes through
the CLIP tower and the projector; the tiles' feature grids are laid side by side as one grid,
the rows and columns that fall on the letterbox padding are cut away, and a learned
``image_newline`` row ends each row of the grid. An image's features: the base tile's, then
that grid row by row, as many as the processor's placeholder tokens for its size."""

from __future__ import annotations

import torch
from infernetes.runtime.model_executor.models.llava import (
    VISION_TOWERS,
    LlavaForConditionalGeneration,
)
from torch import nn
from transformers import PretrainedConfig
from transformers.image_processing_utils import select_best_resolution


def tile_grid(image_size: tuple[int, int], config: PretrainedConfig) -> tuple[int, int]:
    """Rows and columns of tiles for an image of ``(height, width)``: the pinpoint resolution
    the processor picks, over the tower's input size."""
    height, width = select_best_resolution(image_size, config.image_grid_pinpoints)
    tile = config.vision_config.image_size
    return height // tile, width // tile


def unpadded_padding(image_size: tuple[int, int], rows: int, cols: int) -> tuple[int, int]:
    """The rows and the columns cut from each side of a feature grid of ``rows x cols``: the
    padding that fit an image of ``(height, width)`` into the grid's aspect ratio (centred;
    rounded as transformers does)."""
    height, width = image_size
    if width / height > cols / rows:  # wider than the grid: padded above and below
        kept = int(round(height * cols / width, 7))
        return (rows - kept) // 2, 0
    kept = int(round(width * rows / height, 7))
    return 0, (cols - kept) // 2


def unpad(grid: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """``grid`` [D, H, W] without the rows or columns of its padding (``unpadded_padding``)."""
    rows, cols = grid.shape[1:]
    pad_rows, pad_cols = unpadded_padding(image_size, rows, cols)
    return grid[:, pad_rows : rows - pad_rows, pad_cols : cols - pad_cols]


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    encoder_weights = ("multi_modal_projector.", "image_newline")

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__(config, max_position)
        # a tile's rows must be its patches alone to make a square grid: the CLS row dropped
        # from CLIP's (transformers fails otherwise too), nothing dropped from SigLIP's
        with_cls = VISION_TOWERS[config.vision_config.model_type].has_class_token
        if self.drop_cls != with_cls:
            wanted = "default" if with_cls else "full"
            raise ValueError(
                f"vision_feature_select_strategy: {config.vision_config.model_type} tiles take "
                f"{wanted!r}, got {config.vision_feature_select_strategy!r}"
            )
        self.patches = config.vision_config.image_size // config.vision_config.patch_size
        # one vector of the language model's width: every stage holds it (loading stays simple)
        self.image_newline = nn.Parameter(torch.empty(config.text_config.hidden_size))

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``data``: ``pixel_values`` [items, tiles, C, H, W] (padded to the longest item's
        tiles) and ``image_sizes`` [items, 2] (height, width)."""
        if modality != "image":
            raise ValueError(f"LLaVA-NeXT takes images, not {modality}")
        sizes = [(int(h), int(w)) for h, w in data["image_sizes"].tolist()]
        grids = [tile_grid(size, self.config) for size in sizes]
        tiles = [1 + rows * cols for rows, cols in grids]
        pixels = torch.cat([p[:n] for p, n in zip(data["pixel_values"], tiles, strict=True)])
        features = super().embed_multimodal(modality, {"pixel_values": pixels})
        outputs = []
        start = 0
        for size, (rows, cols), n in zip(sizes, grids, tiles, strict=True):
            image = torch.stack(features[start : start + n])
            start += n
            outputs.append(self._pack(image, size, rows, cols))
        return outputs

    def _pack(
        self, tiles: torch.Tensor, size: tuple[int, int], rows: int, cols: int
    ) -> torch.Tensor:
        """One image's rows: the base tile's, then the grid of the others (unpadded), each row
        ended by ``image_newline``."""
        base, rest = tiles[0], tiles[1:]
        p = self.patches
        dim = rest.shape[-1]
        # [rows*cols, p*p, D] -> [D, rows*p, cols*p]: tile (r, c)'s patch (i, j) at (r*p+i, c*p+j)
        grid = rest.view(rows, cols, p, p, dim).permute(4, 0, 2, 1, 3).reshape(dim, rows * p, -1)
        grid = self.fit(unpad(grid, size))
        newline = self.image_newline.to(grid.dtype)[:, None, None].expand(dim, grid.shape[1], 1)
        grid = torch.cat([grid, newline], dim=2)
        return torch.cat([base, grid.flatten(1).t()])

    def fit(self, grid: torch.Tensor) -> torch.Tensor:
        """The unpadded grid as the language model takes it (LLaVA-NeXT: as it is)."""
        return grid
