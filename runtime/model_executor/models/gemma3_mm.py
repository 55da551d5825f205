"""Gemma 3 with images (``Gemma3ForConditionalGeneration``): a SigLIP tower, a projector and the
Gemma 3 text model. An image (or a pan-and-scan crop of one: each is an image of its own to the
model) becomes the tower's post-layernormed last hidden state, average-pooled to
``mm_tokens_per_image`` rows, RMS-normed and projected to the text model's width.

The text model attends bidirectionally within each image's tokens, as transformers' does: an
image token sees every token of its own image (later ones too), each earlier token, and in a
sliding-window layer only those inside its window. The model says so with
``bidirectional_image_attention``: the runner hands the attention layers each image's span
(``AttentionMetadata.bidirectional_spans``) and the scheduler never ends a prefill chunk inside
an image."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.models.gemma import GemmaForCausalLM, GemmaRMSNorm
from infernetes.runtime.model_executor.models.siglip import SiglipVisionTower
from infernetes.runtime.model_executor.models.utils import on_first_stage
from infernetes.runtime.model_executor.models.vision_language import VisionLanguageModel
from torch import nn
from transformers import PretrainedConfig


class Gemma3MultiModalProjector(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        vision = config.vision_config
        self.patches_per_side = vision.image_size // vision.patch_size
        tokens_per_side = int(config.mm_tokens_per_image**0.5)
        if tokens_per_side**2 != config.mm_tokens_per_image or (
            self.patches_per_side % tokens_per_side
        ):
            raise ValueError(
                f"mm_tokens_per_image: a square whose side divides the {self.patches_per_side} "
                f"patches per side, got {config.mm_tokens_per_image}"
            )
        self.pool = self.patches_per_side // tokens_per_side
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vision.hidden_size, config.text_config.hidden_size)
        )

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``[B, patches, vision hidden]`` -> ``[B, mm_tokens_per_image, text hidden]``."""
        batch, _, hidden = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(batch, hidden, side, side)
        pooled = F.avg_pool2d(grid, self.pool).flatten(2).transpose(1, 2)
        return (self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight).to(patches.dtype)


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    bidirectional_image_attention = True
    intermediate_names = GemmaForCausalLM.intermediate_names

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        vision = config.vision_config
        # The pipeline's first stage embeds, so it alone encodes images.
        self.vision_tower = on_first_stage(
            lambda: SiglipVisionTower(vision, vision.num_hidden_layers, post_layernorm=True)
        )
        self.multi_modal_projector = on_first_stage(lambda: Gemma3MultiModalProjector(config))
        self.language_model = GemmaForCausalLM(config.text_config, max_position)

    def embed_multimodal(self, modality: str, data: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        if modality != "image":
            raise ValueError(f"Gemma 3 takes images, not {modality}")
        tower: SiglipVisionTower = self.vision_tower  # type: ignore[assignment]  # first stage
        return list(self.multi_modal_projector(tower.last_hidden_state(data["pixel_values"])))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Gemma 3's image token may lie past the text vocabulary; its rows are the image's
        # anyway, so any id embeds them (transformers embeds 0 there)
        vocab = self.config.text_config.vocab_size
        return self.language_model.embed_input_ids(input_ids.masked_fill(input_ids >= vocab, 0))

    def keeps_encoder_weight(self, name: str) -> bool:
        return name.startswith(("multi_modal_projector.", "vision_tower.")) and not (
            name.startswith("vision_tower.head.")  # SigLIP's pooled output's: never read
        )
