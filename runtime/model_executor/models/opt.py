"""OPT (facebook/opt-*): learned positions (offset 2), ReLU MLP, pre- or post-LayerNorm, optional
input/output projections when the embedding width differs from the hidden size."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.layers.activation import get_activation
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from infernetes.runtime.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.models.utils import load_stacked_weights
from infernetes.runtime.model_executor.parallel import tp_size
from torch import nn
from transformers import PretrainedConfig

# OPT's learned position table starts two rows in (a fairseq convention).
_POSITION_OFFSET = 2


class OPTAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        heads = config.num_attention_heads
        self.head_dim = hidden // heads
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias)
        self.out_proj = RowParallelLinear(hidden, hidden, bias)
        local_heads = heads // tp_size()
        self.attn = Attention(local_heads, self.head_dim, self.head_dim**-0.5, local_heads)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).chunk(3, dim=-1)
        return self.out_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous()))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        bias = getattr(config, "enable_bias", True)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.fc1 = ColumnParallelLinear(hidden, config.ffn_dim, bias)
        self.fc2 = RowParallelLinear(config.ffn_dim, hidden, bias)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.act = get_activation(config.activation_function)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = hidden
        if self.pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        hidden = residual + self.self_attn(hidden)
        if not self.pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        residual = hidden
        if self.pre_norm:
            hidden = self.final_layer_norm(hidden)
        hidden = residual + self.fc2(self.act(self.fc1(hidden)))
        if not self.pre_norm:
            hidden = self.final_layer_norm(hidden)
        return hidden


class OPTDecoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, embed_dim = config.hidden_size, config.word_embed_proj_dim
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, embed_dim)
        self.embed_positions = nn.Embedding(
            config.max_position_embeddings + _POSITION_OFFSET, hidden
        )
        self.project_in = ReplicatedLinear(embed_dim, hidden) if embed_dim != hidden else None
        self.project_out = ReplicatedLinear(hidden, embed_dim) if embed_dim != hidden else None
        use_final_norm = config.do_layer_norm_before and not getattr(
            config, "_remove_final_layer_norm", False
        )
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.final_layer_norm = (
            nn.LayerNorm(hidden, elementwise_affine=affine) if use_final_norm else None
        )
        self.layers = nn.ModuleList(
            OPTDecoderLayer(config) for _ in range(config.num_hidden_layers)
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if self.project_in is not None:
            hidden = self.project_in(hidden)
        hidden = hidden + F.embedding(positions + _POSITION_OFFSET, self.embed_positions.weight)
        for layer in self.layers:
            hidden = layer(hidden)
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden


class OPTModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    stacked_params = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
    ]

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.word_embed_proj_dim)
        self.lm_head.tie(self.model.decoder.embed_tokens)  # OPT always ties the output embedding

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.decoder(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rename(name: str) -> str:
            # Some checkpoints (e.g. facebook/opt-125m) name the decoder without "model.".
            return name if name.startswith(("model.", "lm_head.")) else "model." + name

        loaded = load_stacked_weights(
            self, weights, self.stacked_params, ("lm_head.weight",), rename
        )
        loaded.add("lm_head.weight")
        return loaded
