"""Mistral 3 (``Mistral3ForConditionalGeneration``: Mistral Small 3.1 and 3.2): the Pixtral
tower (``pixtral.py``), a projector that RMS-norms the patches, merges each
``spatial_merge_size`` square of them into one row and projects it through two layers, and a
Mistral (Llama) language model.

An image's placeholder is a grid: one ``[IMG]`` per merged patch, an ``[IMG_BREAK]`` ending each
row, and ``[IMG_END]`` for the last row's break (transformers' ``PixtralProcessor``). The whole
grid is the image's item: its rows are the text embeddings of those tokens with the merged
patches in place of the ``[IMG]`` ones, so a prefill chunk may end anywhere in it. The processor
gives each item its tokens (``placeholder_ids``)."""

from __future__ import annotations

import torch
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM
from infernetes.runtime.model_executor.models.llava import feature_layers
from infernetes.runtime.model_executor.models.pixtral import (
    PixtralVisionTower,
    image_grids,
    placeholder_rows,
)
from infernetes.runtime.model_executor.models.utils import on_first_stage
from infernetes.runtime.model_executor.models.vision_language import (
    VisionLanguageModel,
    text_config,
)
from infernetes.runtime.multimodal.pixtral import PixtralVLProcessor
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN


class Mistral3PatchMerger(nn.Module):
    """Each ``merge x merge`` square of an image's patches as one row (per channel, the square's
    patches row by row), projected back to the tower's width."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        hidden = config.vision_config.hidden_size
        self.merging_layer = nn.Linear(hidden * self.merge**2, hidden, bias=False)

    def forward(self, patches: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        m = self.merge
        grid = patches.view(rows // m, m, columns // m, m, -1)  # [R, i, C, j, D]
        merged = grid.permute(0, 2, 4, 1, 3).reshape((rows // m) * (columns // m), -1)
        return self.merging_layer(merged)


class Mistral3MultiModalProjector(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        self.norm = RMSNorm(vision, config.text_config.rms_norm_eps)
        self.patch_merger = Mistral3PatchMerger(config)
        bias = config.multimodal_projector_bias
        self.linear_1 = nn.Linear(vision, text, bias=bias)
        self.act = ACT2FN[config.projector_hidden_act]
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, patches: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        merged = self.patch_merger(self.norm(patches), rows, columns)
        return self.linear_2(self.act(self.linear_1(merged)))


class Mistral3ForConditionalGeneration(VisionLanguageModel):
    intermediate_names = LlamaForCausalLM.intermediate_names
    hf_processor_class = PixtralVLProcessor  # transformers' needs torchvision

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.image_token_id = config.image_token_index
        self.patch_size = config.vision_config.patch_size
        self.feature_layers = feature_layers(config)
        if len(self.feature_layers) != 1:  # the projector norms one layer's width
            raise ValueError(
                f"vision_feature_layer {config.vision_feature_layer!r}: Mistral 3 reads one "
                "layer of its vision tower (as transformers' does)"
            )
        # The pipeline's first stage embeds, so it alone encodes images.
        self.vision_tower = on_first_stage(
            lambda: PixtralVisionTower(config.vision_config, max(self.feature_layers))
        )
        self.multi_modal_projector = on_first_stage(lambda: Mistral3MultiModalProjector(config))
        self.language_model = LlamaForCausalLM(text_config(config), max_position)

    @staticmethod
    def image_input_shape(config: PretrainedConfig) -> tuple[int | None, ...]:
        return (config.vision_config.num_channels, None, None)  # each image at its own size

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``pixel_values`` ``[items, C, H, W]`` (each item's image at the top left),
        ``image_sizes`` ``[items, 2]`` (its height and width) and ``placeholder_ids`` ``[items,
        L]`` (its grid of tokens) -> each item's ``L`` rows."""
        if modality != "image":
            raise ValueError(f"Mistral 3 takes images, not {modality}")
        grids = image_grids(data["image_sizes"], self.patch_size)
        states = self.vision_tower(data["pixel_values"], grids, self.feature_layers)
        patches = torch.cat(states, dim=-1).split([rows * columns for rows, columns in grids])
        outputs = []
        for image, (rows, columns), ids in zip(
            patches, grids, data["placeholder_ids"], strict=True
        ):
            features = self.multi_modal_projector(image, rows, columns)
            outputs.append(
                placeholder_rows(self.embed_input_ids(ids), ids, self.image_token_id, features)
            )
        return outputs

    def keeps_encoder_weight(self, name: str) -> bool:
        built = tuple(
            f"vision_tower.transformer.layers.{i}." for i in range(max(self.feature_layers))
        )
        return name.startswith("multi_modal_projector.") or (
            name.startswith("vision_tower.")
            and (not name.startswith("vision_tower.transformer.layers.") or name.startswith(built))
        )
