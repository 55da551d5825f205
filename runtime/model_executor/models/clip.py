"""CLIP's vision transformer as a vision-language model's image encoder (LLaVA's tower).

Only the layers up to the deepest one whose hidden states the model reads are built (LLaVA reads
the second to last), and the post-layernorm of CLIP's pooled output is never used. Every rank
holds the whole tower: it is small beside the language model, and images are encoded once per
request, so it runs replicated rather than sharded."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.patch_size = config.patch_size
        self.class_embedding = nn.Parameter(torch.empty(hidden))
        self.patch_embedding = nn.Conv2d(
            config.num_channels, hidden, self.patch_size, self.patch_size, bias=False
        )
        num_positions = (config.image_size // self.patch_size) ** 2 + 1
        self.position_embedding = nn.Embedding(num_positions, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(len(patches), 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class CLIPAttention(nn.Module):
    """Bidirectional attention over one image's patches (no KV cache: an image is encoded
    whole)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class CLIPMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = CLIPAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """``forward(pixel_values [B, C, H, W], feature_layers)``: the hidden states after each of
    ``feature_layers`` (0: the embeddings, i: after layer i), ``[B, patches + 1, hidden]``."""

    has_class_token = True  # the first row, before the patches

    def __init__(self, config: PretrainedConfig, num_layers: int) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # sic
        self.encoder = CLIPEncoder(config, num_layers)

    def forward(
        self, pixel_values: torch.Tensor, feature_layers: Sequence[int]
    ) -> list[torch.Tensor]:
        hidden = self.pre_layrnorm(self.embeddings(pixel_values))
        states = [hidden]
        for layer in self.encoder.layers:
            hidden = layer(hidden)
            states.append(hidden)
        return [states[i] for i in feature_layers]
