"""What the vision-language models here share: an image encoder on the pipeline's first stage
and a language model (``self.language_model``) that takes the image rows in its
``inputs_embeds`` (``models/interfaces.SupportsMultiModal``). Each model says how it encodes an
image (``embed_multimodal``) and which checkpoint tensors its encoder loads
(``keeps_encoder_weight``); the rest is the language model's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM
from infernetes.runtime.model_executor.models.utils import (
    IntermediateTensors,
    load_stacked_weights,
)
from torch import nn
from transformers import PretrainedConfig


def checkpoint_names(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """One naming for the layouts checkpoints come in: the older one (``language_model.model.*``,
    ``vision_tower.vision_model.*``) and transformers 5's (``model.language_model.*``,
    ``model.vision_tower.*``, ``lm_head``)."""
    for name, tensor in weights:
        if name.startswith("model.language_model."):
            name = "language_model.model." + name.removeprefix("model.language_model.")
        elif name.startswith("lm_head."):
            name = "language_model." + name
        else:
            name = name.removeprefix("model.")
        yield name.replace("vision_tower.vision_model.", "vision_tower."), tensor


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config, tied to its embeddings as the top level says (transformers
    ties by the top config: Qwen2-VL-2B's and Mistral 3's say True there only, Qwen3-VL-MoE's
    text config says True by default where its top one says False)."""
    text = config.text_config
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return text


class VisionLanguageModel(nn.Module):
    supports_inputs_embeds = True  # models/interfaces.SupportsMultiModal
    supports_multimodal = True
    language_model: LlamaForCausalLM  # or a family built on it (Gemma's)
    # a stand-in for the Hugging Face processor where that cannot be built here (torchvision)
    hf_processor_class: Any = None

    @classmethod
    def processor_class(cls, config: PretrainedConfig) -> Any:
        """The processor to load for ``config`` (None: transformers' ``AutoProcessor``)."""
        return cls.hf_processor_class

    @staticmethod
    def image_input_shape(config: PretrainedConfig) -> tuple[int | None, ...]:
        vision = config.vision_config
        return (vision.num_channels, vision.image_size, vision.image_size)

    def keeps_encoder_weight(self, name: str) -> bool:
        """Whether the encoder loads checkpoint tensor ``name`` (not the language model's)."""
        raise NotImplementedError

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.language_model(input_ids, positions, intermediate, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        language: list[tuple[str, torch.Tensor]] = []
        encoder: list[tuple[str, torch.Tensor]] = []
        for name, tensor in checkpoint_names(weights):
            if name.startswith("language_model."):
                language.append((name.removeprefix("language_model."), tensor))
            elif self.keeps_encoder_weight(name):
                encoder.append((name, tensor))
        loaded = {"language_model." + n for n in self.language_model.load_weights(language)}
        return loaded | load_stacked_weights(self, encoder, [])
