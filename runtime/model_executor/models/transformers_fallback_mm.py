"""The transformers fallback for image-text-to-text models (``AutoModelForImageTextToText``):
transformers' vision tower and projector encode an image through the model's own
``get_image_features``; its rows take the places of the image's feature tokens, which the
model's Hugging Face processor expanded on the API side (``multimodal/processor.py``); the
language model runs as the causal fallback's, on this engine's paged attention. Which models
fit is ``transformers_fallback.check_image_text_to_text``'s to say (M-RoPE models and those whose
images attend both ways do not)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from infernetes.runtime.model_executor.models.transformers_fallback import (
    ATTENTION_IMPLEMENTATION,
    LOGIT_SCALINGS,
    FallbackUnsupported,
    TransformersForCausalLM,
)
from infernetes.runtime.model_executor.models.utils import IntermediateTensors
from infernetes.runtime.multimodal.processor import SUPPORTED_MODALITIES
from torch import nn
from transformers import AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightRenaming, rename_source_key


class TransformersForImageTextToText(TransformersForCausalLM):
    """A transformers image-text-to-text model behind the engine's multimodal interface
    (``models/interfaces.SupportsMultiModal``)."""

    supports_inputs_embeds = True
    supports_multimodal = True
    modalities = SUPPORTED_MODALITIES
    one_item_per_image = True  # an image's tiles together, as get_image_features takes them

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__(config, max_position)
        # the token whose rows the image's features fill (transformers' get_placeholder_mask)
        self.image_token_id = _image_token_id(config)
        self.image_features_args = set(
            inspect.signature(self.composite.get_image_features).parameters
        )
        # A composite model's head applies the scalings its forward reads, and no other (Aya
        # Vision's leaves Cohere 2's logit_scale unread): what its source names.
        head = inspect.getsource(type(self.hf).forward)
        self.logit_scalings = frozenset(name for name in LOGIT_SCALINGS if name in head)

    def _build(self, config: PretrainedConfig) -> PreTrainedModel:
        # the language model's attention is the paged cache's; the vision tower keeps the one
        # transformers picks for it (SDPA where the tower has it)
        return AutoModelForImageTextToText.from_config(
            config,
            attn_implementation={"text_config": ATTENTION_IMPLEMENTATION},
            dtype=torch.get_default_dtype(),
        )

    @property
    def composite(self) -> Any:
        """transformers' inner model: its vision tower, projector and language model."""
        return self.hf.base_model

    @property
    def language_model(self) -> nn.Module:
        return self.composite.language_model

    def checkpoint_names(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        # transformers saves these models in their older layout (``language_model.model.*``)
        # and renames on load by its own table: the same renames here
        renamings = [
            transform
            for transform in get_model_conversion_mapping(self.hf)
            if isinstance(transform, WeightRenaming)
        ]
        for name, tensor in weights:
            yield rename_source_key(name, renamings, [])[0], tensor

    @staticmethod
    def image_input_shape(config: PretrainedConfig) -> tuple[int | None, ...]:
        vision = getattr(config, "vision_config", None)
        channels = getattr(vision, "num_channels", None)
        size = getattr(vision, "image_size", None)
        # a Pixtral tower takes each image at its own size; the others their one size
        if size is None or getattr(vision, "model_type", None) == "pixtral":
            return (channels, None, None)
        return (channels, size, size)

    @classmethod
    def processor_class(cls, config: PretrainedConfig) -> Any:
        return None  # transformers' AutoProcessor

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf.get_input_embeddings()(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            return super().forward(input_ids, positions)
        out = self.language_model(
            inputs_embeds=inputs_embeds[None], position_ids=positions[None], use_cache=False
        )
        return out.last_hidden_state[0]

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Each image's rows: transformers' ``get_image_features`` of its tiles for its feature
        tokens, and the other tokens of its span (``placeholder_ids``: tile marks) their own
        embeddings."""
        if modality not in self.modalities:
            raise ValueError(f"{type(self.hf).__name__} takes images, not {modality}")
        items = len(data["pixel_values"])
        # each item's tiles ([items, tiles, C, H, W]) as one batch of them, as transformers
        # takes a prompt's
        pixel_values = data["pixel_values"].flatten(0, 1)
        extra = {k: v for k, v in data.items() if k in self.image_features_args}
        extra.pop("pixel_values", None)
        out = self.composite.get_image_features(
            pixel_values=pixel_values, return_dict=True, **extra
        )
        features = _per_item(getattr(out, "pooler_output", out), items)
        rows = []
        for ids, image_rows in zip(data["placeholder_ids"], features, strict=True):
            embeds = self.embed_input_ids(ids)
            embeds[ids == self.image_token_id] = image_rows.to(embeds.dtype)
            rows.append(embeds)
        return rows


def _image_token_id(config: PretrainedConfig) -> int:
    token = getattr(config, "image_token_id", None)
    token = token if token is not None else getattr(config, "image_token_index", None)
    if token is None:
        raise FallbackUnsupported(f"{type(config).__name__} names no image token (image_token_id)")
    return int(token)


def _per_item(features: Any, items: int) -> list[torch.Tensor]:
    """transformers' image features (one ``[rows, hidden]`` tensor per image, a stack of them,
    or all rows flattened) as one tensor per item."""
    if isinstance(features, list | tuple):
        features = [f.reshape(-1, f.shape[-1]) for f in features]
        if len(features) == items:
            return features
        features = torch.cat(features)
    if features.dim() == 3 and len(features) == items:
        return list(features)
    flat = features.reshape(-1, features.shape[-1])
    if len(flat) % items:
        raise ValueError(f"{len(flat)} image feature rows do not divide among {items} images")
    return list(flat.split(len(flat) // items))
