"""LLaVA-OneVision's processor, for where transformers' ``LlavaOnevisionProcessor`` cannot be
built (its video half needs torchvision). Images go through the checkpoint's own image processor
(transformers' PIL one: anyres grid selection, tiles, the base image); each ``<image>`` of the
text then becomes as many tokens as transformers' processor counts for it: the base tile's
patches, the unpadded grid's (scaled down past ``anyres_max_N`` tiles' worth) and a newline per
grid row. In a prompt with several images each is its base image alone, squared (patches and a
newline), as transformers does. A video's frames are each resized to the tower's input and
normalized as an image (OneVision's video processor does no more), and its ``<video>`` becomes
its frames' pooled patches and one newline.

It stands in for the Hugging Face processor inside ``processor.MultiModalProcessor`` (the same
attributes and call), so the prompt checks, the digests and the processor cache are shared."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from infernetes.runtime.model_executor.models.llava_next import tile_grid, unpadded_padding

IMAGE, VIDEO = "<image>", "<video>"
ASPECT_RATIO = re.compile(r"anyres_max_(\d+)")


def fitted_size(rows: int, cols: int, max_tiles: int, patches: int) -> tuple[int, int]:
    """An unpadded feature grid's rows and columns as the language model takes them: scaled
    down to about ``max_tiles`` tiles of ``patches x patches`` when over them by 10% in side."""
    ratio = math.sqrt(rows * cols / (max_tiles * patches**2))
    if ratio <= 1.1:
        return rows, cols
    return int(rows // ratio), int(cols // ratio)


def pooled_side(patches: int) -> int:
    """A video frame's grid side after OneVision's 2 x 2 pooling."""
    return math.ceil(patches / 2)


def max_tiles(config: Any) -> int:
    """N of the config's ``vision_aspect_ratio`` ``anyres_max_N``."""
    value = getattr(config, "vision_aspect_ratio", "anyres_max_9")
    match = ASPECT_RATIO.fullmatch(str(value))
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"vision_aspect_ratio: 'anyres_max_N' with N of 1 or more, got {value!r}")
    return int(match.group(1))


class LlavaOnevisionVLProcessor:
    def __init__(self, image_processor: Any, tokenizer: Any, config: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.config = config
        self.image_token, self.video_token = IMAGE, VIDEO
        self.image_token_ids = [config.image_token_index]
        self.patches = config.vision_config.image_size // config.vision_config.patch_size
        self.max_tiles = max_tiles(config)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, trust_remote_code: bool = False
    ) -> LlavaOnevisionVLProcessor:
        from infernetes.runtime.tokenization.tokenizer import get_tokenizer
        from transformers import AutoConfig
        from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
            LlavaOnevisionImageProcessorPil,
        )

        return cls(
            LlavaOnevisionImageProcessorPil.from_pretrained(str(path)),
            get_tokenizer(path, trust_remote_code=trust_remote_code),
            AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code),
        )

    def __call__(
        self,
        text: str,
        images: list[Any] | None = None,
        videos: list[list[Any]] | None = None,
        return_tensors: str = "np",
        add_special_tokens: bool = True,
        fps: Any = None,  # a video's frames are taken as given: no time enters the features
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` ``[1, L]``; with images ``pixel_values``
        ``[images, tiles, C, H, W]``, ``image_sizes`` ``[images, 2]`` (height, width) and
        ``batch_num_images``; with videos ``pixel_values_videos`` ``[videos, frames, C, H, W]``
        (numpy arrays)."""
        out: dict[str, Any] = {}
        if images:
            several = len(images) > 1
            processed = self._images(images, several, kwargs)
            out["pixel_values"] = np.asarray(processed["pixel_values"])
            out["image_sizes"] = np.asarray(processed["image_sizes"], np.int64)
            out["batch_num_images"] = np.asarray([len(images)], np.int64)
            counts = self._get_num_multimodal_tokens(
                image_sizes=out["image_sizes"].tolist()
            ).num_image_tokens
            text = _expand(text, IMAGE, [IMAGE * n for n in counts])
        if videos:
            frames = [self._frames(video, kwargs) for video in videos]
            # stacked as transformers' processor gives them, where the videos' lengths allow
            same = len({len(video) for video in frames}) == 1
            out["pixel_values_videos"] = np.stack(frames) if same else frames
            per_video = [len(video) * pooled_side(self.patches) ** 2 + 1 for video in videos]
            text = _expand(text, VIDEO, [VIDEO * n for n in per_video])
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        out["input_ids"] = np.asarray([ids], np.int64)
        out["attention_mask"] = np.ones_like(out["input_ids"])
        return out

    def _images(self, images: list[Any], several: bool, kwargs: dict[str, Any]) -> Any:
        if not several:
            return self.image_processor(images, return_tensors="np", **kwargs)
        # one prompt's images as one group: transformers' processor squares each and does not
        # tile it; the processor cache keeps single images, so it is gone round here
        processor = getattr(self.image_processor, "inner", self.image_processor)
        return processor([images], return_tensors="np", **kwargs)

    def _frames(self, frames: list[Any], kwargs: dict[str, Any]) -> np.ndarray:
        """A video's frames resized to the tower's input and normalized: ``[frames, C, H, W]``."""
        side = self.config.vision_config.image_size
        return np.stack([_frame(self.image_processor, frame, side) for frame in frames])

    def image_token_count(self, height: int, width: int) -> int:
        """An image's tokens alone in its prompt: the base tile's patches, then the unpadded
        (and fitted) grid's, a newline ending each of its rows."""
        p = self.patches
        grid_rows, grid_cols = tile_grid((height, width), self.config)
        rows, cols = grid_rows * p, grid_cols * p
        pad_rows, pad_cols = unpadded_padding((height, width), rows, cols)
        rows, cols = fitted_size(rows - 2 * pad_rows, cols - 2 * pad_cols, self.max_tiles, p)
        return p * p + rows * cols + rows

    def _get_num_multimodal_tokens(
        self, image_sizes: list[tuple[int, int]], **kwargs: Any
    ) -> SimpleNamespace:
        """Each image's placeholder tokens from its ``(height, width)``: alone in its prompt
        as ``image_token_count`` says, among several its patches and a newline."""
        if len(image_sizes) > 1:
            return SimpleNamespace(num_image_tokens=[self.patches**2 + 1] * len(image_sizes))
        return SimpleNamespace(num_image_tokens=[self.image_token_count(*image_sizes[0])])


def _frame(processor: Any, frame: Any, side: int) -> np.ndarray:
    """One frame as OneVision's video processor makes it: resized (bicubic; PIL's, where that
    processor uses torchvision's) to ``side`` square, rescaled to [0, 1] and normalized with the
    mean and deviation of the image processor (OneVision's two share CLIP's)."""
    from PIL import Image

    resized = frame.convert("RGB").resize((side, side), Image.Resampling.BICUBIC)
    pixels = np.asarray(resized, np.float32) * np.float32(processor.rescale_factor)
    mean = np.asarray(processor.image_mean, np.float32)
    std = np.asarray(processor.image_std, np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1)


def _expand(text: str, placeholder: str, expansions: list[str]) -> str:
    """Each ``placeholder`` of ``text`` replaced by its expansion, in order."""
    pieces = text.split(placeholder)
    if len(pieces) != len(expansions) + 1:
        raise ValueError(
            f"{len(pieces) - 1} {placeholder} placeholder(s) for {len(expansions)} item(s)"
        )
    return pieces[0] + "".join(e + piece for e, piece in zip(expansions, pieces[1:], strict=True))
