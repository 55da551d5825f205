"""Qwen2-VL and Qwen2.5-VL (``Qwen2VLForConditionalGeneration``,
``Qwen2_5_VLForConditionalGeneration``): the Qwen vision transformer (``qwen_vision.py``) and a
Qwen2 language model with M-RoPE. An image is encoded at its own resolution into one row per
merge block of patches, in place of its ``<|image_pad|>`` tokens; the language model turns each
token's query and key by its (frame, row, column) position (``layers/rotary.MRotaryEmbedding``),
which the runner lays out from the whole prompt (``worker/mrope.py``), because the model says
``mrope_merge_size``.

The tower is plain PyTorch modules: replicated on every tensor rank of the first pipeline
stage, each encoding the whole image (the language model is split as Qwen2's)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM
from infernetes.runtime.model_executor.models.qwen_vision import QwenVisionTransformer
from infernetes.runtime.model_executor.models.utils import on_first_stage
from infernetes.runtime.model_executor.models.vision_language import (
    VisionLanguageModel,
    text_config,
)
from infernetes.runtime.multimodal.qwen_vl import QwenVLProcessor
from torch import nn
from transformers import PretrainedConfig


def _qwen_checkpoint_names(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The Qwen hub checkpoints' older layout (``model.layers.*`` for the language model,
    ``visual.*``) in transformers 5's (``model.language_model.*``), which
    ``vision_language.checkpoint_names`` reads with the rest."""
    for name, tensor in weights:
        if name.startswith("model.") and not name.startswith(("model.visual.", "model.language_")):
            name = "model.language_model." + name.removeprefix("model.")
        yield name, tensor


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    intermediate_names = LlamaForCausalLM.intermediate_names
    # transformers' processor needs torchvision (qwen_vl.py)
    hf_processor_class: type[QwenVLProcessor] = QwenVLProcessor
    modalities = ("image", "video")
    tower_class: type[nn.Module] = QwenVisionTransformer

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        vision = config.vision_config
        self.mrope_merge_size = vision.spatial_merge_size  # the runner lays out M-RoPE
        # Qwen2.5-VL spaces a video's frames by their time; Qwen2-VL (None) by their index
        self.mrope_tokens_per_second = getattr(vision, "tokens_per_second", None)
        # The pipeline's first stage embeds, so it alone encodes images.
        self.visual = on_first_stage(lambda: self.tower_class(vision))
        self.language_model = self.build_language_model(text_config(config), max_position)

    def build_language_model(self, text: PretrainedConfig, max_position: int) -> LlamaForCausalLM:
        return LlamaForCausalLM(text, max_position)

    @staticmethod
    def image_input_shape(config: PretrainedConfig) -> tuple[int, ...]:
        vision = config.vision_config
        return (vision.in_channels * vision.temporal_patch_size * vision.patch_size**2,)

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``pixel_values`` ``[items, patches, C * t * p * p]`` and ``image_grid_thw``
        ``[items, 3]`` (items of one size, stacked), or a video's ``pixel_values_videos`` and
        ``video_grid_thw`` -> each item's rows."""
        if modality not in ("image", "video"):
            raise ValueError(f"Qwen2-VL takes images and videos, not {modality}")
        # a video's: pixel_values_videos and video_grid_thw (its temporal patches, t > 1)
        pixels = data["pixel_values" if modality == "image" else "pixel_values_videos"]
        grid_name = "image_grid_thw" if modality == "image" else "video_grid_thw"
        grids = [(int(t), int(h), int(w)) for t, h, w in data[grid_name].tolist()]
        rows = self.visual(pixels.reshape(-1, pixels.shape[-1]), grids)
        sizes = [t * h * w // self.mrope_merge_size**2 for t, h, w in grids]
        return list(rows.split(sizes))

    def keeps_encoder_weight(self, name: str) -> bool:
        return name.startswith("visual.")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_qwen_checkpoint_names(weights))


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):  # the HF name
    """The same with Qwen2.5-VL's tower (windows, RMSNorm, SwiGLU: ``qwen_vision.py``)."""
