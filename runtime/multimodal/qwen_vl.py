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


class QwenVLProcessor:
    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = getattr(tokenizer, "image_token", None) or IMAGE_PAD
        self.image_token_ids = [tokenizer.convert_tokens_to_ids(self.image_token)]

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
        return_tensors: str = "np",
        add_special_tokens: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` ``[1, L]`` and, with images, ``pixel_values`` (their patches, one row
        each, image after image) and ``image_grid_thw`` ``[images, 3]``; numpy arrays."""
        out: dict[str, Any] = {}
        if images:
            processed = self.image_processor(images, return_tensors="np", **kwargs)
            out = {name: np.asarray(processed[name]) for name in ("pixel_values", "image_grid_thw")}
            merge = kwargs.get("merge_size") or self.image_processor.merge_size
            pieces = text.split(self.image_token)
            if len(pieces) != len(images) + 1:
                raise ValueError(
                    f"{len(pieces) - 1} {self.image_token} placeholder(s) for {len(images)} images"
                )
            counts = [int(grid.prod()) // merge**2 for grid in out["image_grid_thw"]]
            text = pieces[0] + "".join(
                self.image_token * count + piece
                for count, piece in zip(counts, pieces[1:], strict=True)
            )
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        out["input_ids"] = np.asarray([ids], np.int64)
        out["attention_mask"] = np.ones_like(out["input_ids"])
        return out

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
