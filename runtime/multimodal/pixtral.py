"""Pixtral's and Mistral 3's processor, for where transformers' ``PixtralProcessor`` cannot be
built (it needs torchvision). The image processor (the PIL one) resizes an image to fit
``longest_edge`` and rounds its sides up to whole merged patches; each ``[IMG]`` of the text then
becomes its image's grid, as transformers' does: a row of ``[IMG]`` per row of merged patches,
each row ended by ``[IMG_BREAK]``, the last by ``[IMG_END]``.

It stands in for the Hugging Face processor inside ``processor.MultiModalProcessor`` (the same
attributes and call), so the prompt checks, the digests and the processor cache are shared."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

IMAGE, IMAGE_BREAK, IMAGE_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
PROCESSOR_CONFIG = "processor_config.json"  # where the checkpoint keeps patch_size and the merge


class PixtralVLProcessor:
    def __init__(
        self, image_processor: Any, tokenizer: Any, patch_size: int, spatial_merge_size: int
    ) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.unit = patch_size * spatial_merge_size  # the pixels of a merged patch's side
        self.image_token = IMAGE
        # an image's placeholder tokens, its [IMG] first (the rows its features fill)
        self.image_token_ids = tokenizer.convert_tokens_to_ids([IMAGE, IMAGE_BREAK, IMAGE_END])

    @classmethod
    def from_pretrained(
        cls, path: str | Path, trust_remote_code: bool = False
    ) -> PixtralVLProcessor:
        from infernetes.runtime.tokenization.tokenizer import get_tokenizer
        from transformers import AutoConfig, AutoImageProcessor

        settings_path = Path(path) / PROCESSOR_CONFIG
        settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        return cls(
            AutoImageProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code),
            # the Hugging Face files, where the folder has a tekken.json beside them too
            get_tokenizer(path, trust_remote_code=trust_remote_code),
            settings.get("patch_size", config.vision_config.patch_size),
            settings.get("spatial_merge_size", getattr(config, "spatial_merge_size", 1)),
        )

    def __call__(
        self,
        text: str,
        images: list[Any] | None = None,
        return_tensors: str = "np",
        add_special_tokens: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``input_ids`` and ``attention_mask`` ``[1, L]`` and, with images, ``pixel_values``
        ``[images, C, H, W]`` (each at the top left, padded to the largest) and ``image_sizes``
        ``[images, 2]`` (height, width); numpy arrays."""
        out: dict[str, Any] = {}
        if images:
            size = {"height": self.unit, "width": self.unit}
            processed = self.image_processor(images, return_tensors="np", patch_size=size, **kwargs)
            out["pixel_values"] = np.asarray(processed["pixel_values"])
            out["image_sizes"] = np.asarray(processed["image_sizes"], np.int64)
            pieces = text.split(IMAGE)
            if len(pieces) != len(images) + 1:
                raise ValueError(
                    f"{len(pieces) - 1} {IMAGE} placeholder(s) for {len(images)} image(s)"
                )
            text = pieces[0] + "".join(
                self._grid(height, width) + piece
                for (height, width), piece in zip(
                    out["image_sizes"].tolist(), pieces[1:], strict=True
                )
            )
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        out["input_ids"] = np.asarray([ids], np.int64)
        out["attention_mask"] = np.ones_like(out["input_ids"])
        return out

    def _grid(self, height: int, width: int) -> str:
        """The placeholder of an image processed to ``height x width`` pixels."""
        row = IMAGE * (width // self.unit)
        return (row + IMAGE_BREAK) * (height // self.unit - 1) + row + IMAGE_END

    def _get_num_multimodal_tokens(
        self, image_sizes: list[tuple[int, int]], **kwargs: Any
    ) -> SimpleNamespace:
        """Each image's placeholder tokens from its ``(height, width)``, as transformers'
        processor counts them: its grid's rows, each with its break or end."""
        from transformers.models.pixtral.image_processing_pil_pixtral import (
            get_resize_output_image_size,
        )

        size = kwargs.get("size") or self.image_processor.size
        longest = size["longest_edge"]
        counts = []
        for height, width in image_sizes:
            resized = get_resize_output_image_size(
                np.zeros((height, width, 3)), size=(longest, longest), patch_size=self.unit
            )
            rows, columns = (side // self.unit for side in resized)
            counts.append(rows * (columns + 1))
        return SimpleNamespace(num_image_tokens=counts)
