"""Qwen2-VL's and Qwen2.5-VL's processor, for where transformers' ``Qwen2VLProcessor`` cannot be
built: it resolves its video processor's class when constructed, and that needs torchvision.
The image processor (the PIL one without torchvision) and the tokenizer do what it does for
images: each ``<|image_pad|>`` of the text becomes one per merged patch of its image
(``grid_t * grid_h * grid_w / merge_size**2``), then the text is tokenized.

It stands in for the Hugging Face processor inside ``processor.MultiModalProcessor`` (the same
attributes and call), so the prompt checks, the digests and the processor cache are shared."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
DEFAULT_FPS = 2.0  # the frame rate a video's frames are taken at when none is given (Qwen's)


def video_patches(
    frame_patches: np.ndarray, temporal_patch_size: int, patch_size: int
) -> np.ndarray:
    """One video's patches from its frames' (the image processor's, which repeats a frame over
    the temporal patch): ``[frames, patches, C * t * p * p]`` -> the frames taken
    ``temporal_patch_size`` at a time (the last repeated to fill the last), ``[grid_t * patches,
    C * t * p * p]``, each patch holding its frames' pixels in turn, as Qwen's video processor
    lays them out."""
    frames, patches, width = frame_patches.shape
    channels = width // (temporal_patch_size * patch_size**2)
    one = frame_patches.reshape(frames, patches, channels, temporal_patch_size, -1)[:, :, :, 0]
    missing = -frames % temporal_patch_size
    if missing:
        one = np.concatenate([one, np.repeat(one[-1:], missing, axis=0)])
    grid_t = len(one) // temporal_patch_size
    grouped = one.reshape(grid_t, temporal_patch_size, patches, channels, -1)
    return grouped.transpose(0, 2, 3, 1, 4).reshape(grid_t * patches, width)


class QwenVLProcessor:
    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = getattr(tokenizer, "image_token", None) or IMAGE_PAD
        self.image_token_ids = [tokenizer.convert_tokens_to_ids(self.image_token)]
        self.video_token = getattr(tokenizer, "video_token", None) or VIDEO_PAD

    @classmethod
    def from_pretrained(cls, path: str | Path, trust_remote_code: bool = False) -> QwenVLProcessor:
        from transformers import AutoImageProcessor, AutoTokenizer

        return cls(
            AutoImageProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code),
            AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code),
        )

    def __call__(
        self,
        text: str,
        images: list[Any] | None = None,
        videos: list[list[Any]] | None = None,
        return_tensors: str = "np",
        add_special_tokens: bool = True,
        fps: float | list[float] = DEFAULT_FPS,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` ``[1, L]`` and, with images, ``pixel_values`` (their
        patches, one row each, image after image) and ``image_grid_thw`` ``[images, 3]``; with
        videos (each a list of frames of one size, taken at ``fps``, one rate or each video's) ``pixel_values_videos``,
        ``video_grid_thw`` and ``second_per_grid_ts`` (the seconds a temporal patch spans);
        numpy arrays."""
        out: dict[str, Any] = {}
        if videos:
            out.update(self._videos(videos, fps, kwargs))
            frames = [len(video) for video in videos]
            text = self._expand_videos(text, frames, out["video_grid_thw"], fps, kwargs)
        if images:
            processed = self.image_processor(images, return_tensors="np", **kwargs)
            out.update(
                {name: np.asarray(processed[name]) for name in ("pixel_values", "image_grid_thw")}
            )
            text = self._expand(text, self.image_token, out["image_grid_thw"], kwargs)
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        out["input_ids"] = np.asarray([ids], np.int64)
        out["attention_mask"] = np.ones_like(out["input_ids"])
        return out

    def _expand(self, text: str, token: str, grids: np.ndarray, kwargs: dict[str, Any]) -> str:
        """Each ``token`` of ``text`` repeated once per merged patch of its item's grid."""
        merge = kwargs.get("merge_size") or self.image_processor.merge_size
        return _replace_each(
            text, token, [token * (int(grid.prod()) // merge**2) for grid in grids]
        )

    def _expand_videos(
        self,
        text: str,
        frames: list[int],
        grids: np.ndarray,
        fps: float | list[float],
        kwargs: dict[str, Any],
    ) -> str:
        """Each ``<|video_pad|>`` of ``text`` (its video of ``frames`` frames taken at ``fps``,
        one rate or each video's) repeated once per merged patch of its video."""
        return self._expand(text, VIDEO_PAD, grids, kwargs)

    def _videos(
        self, videos: list[list[Any]], fps: float | list[float], kwargs: dict[str, Any]
    ) -> dict[str, np.ndarray]:
        """Each video's frames through the image processor (the processor cache keeps each
        frame's arrays), then taken ``temporal_patch_size`` at a time."""
        processor = self.image_processor
        temporal = kwargs.get("temporal_patch_size") or processor.temporal_patch_size
        patch = kwargs.get("patch_size") or processor.patch_size
        patches, grids = [], []
        for frames in videos:
            processed = processor(frames, return_tensors="np", **kwargs)
            frame_grids = np.asarray(processed["image_grid_thw"])
            if (frame_grids != frame_grids[0]).any():
                raise ValueError("a video's frames must all have one size")
            flat = np.asarray(processed["pixel_values"])
            pixels = flat.reshape(len(frames), -1, flat.shape[-1])
            one = video_patches(pixels, temporal, patch)
            patches.append(one)
            _, height, width = (int(v) for v in frame_grids[0])
            grids.append([len(one) // (height * width), height, width])
        return {
            "pixel_values_videos": np.concatenate(patches),
            "video_grid_thw": np.asarray(grids, np.int64),
            "second_per_grid_ts": np.broadcast_to(
                temporal / np.asarray(fps, np.float32), len(videos)
            ).astype(np.float32),
        }

    def _get_num_multimodal_tokens(
        self, image_sizes: list[tuple[int, int]], **kwargs: Any
    ) -> SimpleNamespace:
        """Each image's placeholder tokens from its ``(height, width)``, as transformers'
        processors count them."""
        merge = kwargs.get("merge_size") or self.image_processor.merge_size
        patches = [
            self.image_processor.get_number_of_image_patches(height, width, kwargs)
            for height, width in image_sizes
        ]
        return SimpleNamespace(num_image_tokens=[count // merge**2 for count in patches])


class Qwen3VLProcessor(QwenVLProcessor):
    """Qwen3-VL's: a video's frames are told apart by their time in the text rather than in
    M-RoPE. Its ``<|video_pad|>`` becomes, for each temporal patch, ``<{seconds:.1f} seconds>``
    (the mean time of the patch's first and last frame; the last frame repeated to fill the
    last patch) and the patch's tokens between ``<|vision_start|>`` and ``<|vision_end|>``."""

    def _expand_videos(
        self,
        text: str,
        frames: list[int],
        grids: np.ndarray,
        fps: float | list[float],
        kwargs: dict[str, Any],
    ) -> str:
        rates = fps if isinstance(fps, list) else [fps] * len(frames)
        merge = kwargs.get("merge_size") or self.image_processor.merge_size
        processor = getattr(self.image_processor, "inner", self.image_processor)
        temporal = kwargs.get("temporal_patch_size") or processor.temporal_patch_size
        placeholders = []
        for count, grid, rate in zip(frames, grids, rates, strict=True):
            grid_t, height, width = (int(v) for v in grid)
            tokens = VIDEO_PAD * (height * width // merge**2)
            patches = []
            for patch in range(grid_t):
                first = patch * temporal
                last = min(first + temporal - 1, count - 1)
                seconds = (first / rate + last / rate) / 2
                patches.append(f"<{seconds:.1f} seconds>{VISION_START}{tokens}{VISION_END}")
            placeholders.append("".join(patches))
        return _replace_each(text, VIDEO_PAD, placeholders)


def _replace_each(text: str, token: str, replacements: list[str]) -> str:
    """``text`` with its ``token``s replaced by ``replacements`` in turn, one each."""
    pieces = text.split(token)
    if len(pieces) != len(replacements) + 1:
        raise ValueError(
            f"{len(pieces) - 1} {token} placeholder(s) for {len(replacements)} item(s)"
        )
    return pieces[0] + "".join(
        new + piece for new, piece in zip(replacements, pieces[1:], strict=True)
    )
