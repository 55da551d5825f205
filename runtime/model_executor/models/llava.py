"""LLaVA (``LlavaForConditionalGeneration``): a CLIP vision tower, a two-layer projector and a
Llama language model. An image becomes the tower's hidden states at ``vision_feature_layer``
(CLS dropped under the ``default`` strategy), projected to the language model's width; those
rows stand in for the image's placeholder tokens, and from there it is Llama.

With a Pixtral tower (Pixtral-12B's Hugging Face layout, ``vision_config.model_type`` pixtral)
an image is encoded at its own size, one row a patch, into its placeholder grid as Mistral 3's
(``mistral3.py``), through the same processor stand-in."""

from __future__ import annotations

from typing import Any

import torch
from infernetes.runtime.model_executor.models.clip import CLIPVisionTower
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM
from infernetes.runtime.model_executor.models.pixtral import (
    PixtralVisionTower,
    image_grids,
    placeholder_rows,
)
from infernetes.runtime.model_executor.models.siglip import SiglipVisionTower
from infernetes.runtime.model_executor.models.utils import on_first_stage
from infernetes.runtime.model_executor.models.vision_language import VisionLanguageModel
from infernetes.runtime.multimodal.pixtral import PixtralVLProcessor
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN

SELECT_STRATEGIES = ("default", "full")
# what only the towers' pooled output reads (CLIP's and SigLIP's post-layernorm, SigLIP's head)
UNUSED_TOWER_WEIGHTS = ("vision_tower.post_layernorm.", "vision_tower.head.")


def feature_layers(config: PretrainedConfig) -> list[int]:
    """The vision tower's hidden states LLaVA reads (0: the embeddings, i: after layer i), from
    ``vision_feature_layer``: one index or a list, negative ones counted from the last."""
    layers = config.vision_feature_layer
    layers = list(layers) if isinstance(layers, list | tuple) else [layers]
    num_states = config.vision_config.num_hidden_layers + 1
    return [layer % num_states for layer in layers]


def is_pixtral(config: PretrainedConfig) -> bool:
    """Whether a LLaVA's tower is Pixtral's (Pixtral-12B's Hugging Face layout)."""
    return config.vision_config.model_type == "pixtral"


VISION_TOWERS: dict[str, type[CLIPVisionTower] | type[SiglipVisionTower]] = {
    "clip_vision_model": CLIPVisionTower,
    "siglip_vision_model": SiglipVisionTower,
}


def vision_tower(config: PretrainedConfig, num_layers: int) -> nn.Module:
    """The tower ``config`` names (CLIP's or SigLIP's), its first ``num_layers`` layers."""
    tower = VISION_TOWERS.get(config.model_type)
    if tower is None:
        raise ValueError(
            f"vision_config.model_type {config.model_type!r} is not supported; one of "
            f"{', '.join(VISION_TOWERS)}"
        )
    return tower(config, num_layers)


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        vision = config.vision_config.hidden_size * len(feature_layers(config))
        text = config.text_config.hidden_size
        bias = getattr(config, "multimodal_projector_bias", True)
        self.linear_1 = nn.Linear(vision, text, bias=bias)
        self.act = ACT2FN[config.projector_hidden_act]
        self.linear_2 = nn.Linear(text, text, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


class LlavaForConditionalGeneration(VisionLanguageModel):
    intermediate_names = LlamaForCausalLM.intermediate_names
    # checkpoint names (beside the tower's) the first stage loads with the encoder
    encoder_weights: tuple[str, ...] = ("multi_modal_projector.",)

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        strategy = config.vision_feature_select_strategy
        if strategy not in SELECT_STRATEGIES:
            raise ValueError(
                f"vision_feature_select_strategy {strategy!r} is not supported; one of "
                f"{', '.join(SELECT_STRATEGIES)}"
            )
        self.config = config
        self.drop_cls = strategy == "default"
        self.feature_layers = feature_layers(config)
        # Pixtral-12B's layout: a Pixtral tower, images at their own size (``pixtral.py``)
        self.pixtral = is_pixtral(config)
        if self.pixtral and self.drop_cls:
            raise ValueError(
                "vision_feature_select_strategy: a pixtral tower has no class token to drop; "
                "it takes 'full'"
            )
        layers = max(self.feature_layers)
        # The pipeline's first stage embeds, so it alone encodes images.
        self.vision_tower = on_first_stage(
            lambda: (
                PixtralVisionTower(config.vision_config, layers)
                if self.pixtral
                else vision_tower(config.vision_config, layers)
            )
        )
        self.multi_modal_projector = on_first_stage(lambda: LlavaMultiModalProjector(config))
        self.language_model = LlamaForCausalLM(config.text_config, max_position)

    @staticmethod
    def image_input_shape(config: PretrainedConfig) -> tuple[int | None, ...]:
        if is_pixtral(config):
            return (config.vision_config.num_channels, None, None)  # each at its own size
        return VisionLanguageModel.image_input_shape(config)

    @classmethod
    def processor_class(cls, config: PretrainedConfig) -> Any:
        # transformers' PixtralProcessor needs torchvision
        return PixtralVLProcessor if is_pixtral(config) else cls.hf_processor_class

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        if modality != "image":
            raise ValueError(f"LLaVA takes images, not {modality}")
        if self.pixtral:
            return self._embed_pixtral(data)
        states = self.vision_tower(data["pixel_values"], self.feature_layers)
        if self.drop_cls:
            states = [state[:, 1:] for state in states]
        return list(self.multi_modal_projector(torch.cat(states, dim=-1)))

    def _embed_pixtral(self, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Each image's placeholder grid (as Mistral 3's), one row a patch: no merging."""
        grids = image_grids(data["image_sizes"], self.config.vision_config.patch_size)
        states = self.vision_tower(data["pixel_values"], grids, self.feature_layers)
        features = self.multi_modal_projector(torch.cat(states, dim=-1))
        image = self.config.image_token_index
        return [
            placeholder_rows(self.embed_input_ids(ids), ids, image, rows)
            for rows, ids in zip(
                features.split([r * c for r, c in grids]), data["placeholder_ids"], strict=True
            )
        ]

    def keeps_encoder_weight(self, name: str) -> bool:
        # not the tower layers past the deepest one read, nor the pooled output's weights
        layers = (
            "vision_tower.transformer.layers." if self.pixtral else "vision_tower.encoder.layers."
        )
        built = tuple(f"{layers}{i}." for i in range(max(self.feature_layers)))
        return name.startswith(self.encoder_weights) or (
            name.startswith("vision_tower.")
            and (not name.startswith(layers) or name.startswith(built))
            and not name.startswith(UNUSED_TOWER_WEIGHTS)
        )
