"""SigLIP's vision transformer as an image encoder (LLaVA-OneVision's tower). CLIP's layers
(``clip.py``) with other embeddings: a patch convolution with a bias, a position per patch and
no class token, and no layernorm before the encoder. The attention-pooling head serves SigLIP's
pooled output, which a vision-language model never reads: it is not built. The post-layernorm is
built only for a model that reads the last hidden state as transformers returns it (Gemma 3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from infernetes.runtime.model_executor.models.clip import CLIPEncoder
from torch import nn
from transformers import PretrainedConfig


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.patch_embedding = nn.Conv2d(
            config.num_channels, hidden, config.patch_size, config.patch_size
        )
        num_positions = (config.image_size // config.patch_size) ** 2
        self.position_embedding = nn.Embedding(num_positions, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype)).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight


class SiglipVisionTower(nn.Module):
    """``forward(pixel_values [B, C, H, W], feature_layers)``: the hidden states after each of
    ``feature_layers`` (0: the embeddings, i: after layer i), ``[B, patches, hidden]``."""

    has_class_token = False  # every row is a patch

    def __init__(
        self, config: PretrainedConfig, num_layers: int, post_layernorm: bool = False
    ) -> None:
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = CLIPEncoder(config, num_layers)
        if post_layernorm:
            self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, pixel_values: torch.Tensor, feature_layers: Sequence[int]
    ) -> list[torch.Tensor]:
        hidden = self.embeddings(pixel_values)
        states = [hidden]
        for layer in self.encoder.layers:
            hidden = layer(hidden)
            states.append(hidden)
        return [states[i] for i in feature_layers]

    def last_hidden_state(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The post-layernormed output of the last layer built, ``[B, patches, hidden]``."""
        [hidden] = self(pixel_values, [len(self.encoder.layers)])
        return self.post_layernorm(hidden)
