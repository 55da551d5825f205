"""BERT encoder for embeddings (``--task embed``): bidirectional attention over each whole prompt,
post-LayerNorm, then the pooler the model folder declares. No KV cache: a prompt is encoded in one
step."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.context import get_attention_metadata
from infernetes.runtime.model_executor.layers.activation import get_activation
from infernetes.runtime.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.layers.pooler import Pooler
from infernetes.runtime.model_executor.models.utils import load_stacked_weights
from infernetes.runtime.model_executor.parallel import tp_size
from torch import nn
from transformers import PretrainedConfig


class BertEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        hidden = hidden + self.token_type_embeddings.weight[0]  # one segment: token type 0
        return self.LayerNorm(hidden)


class BertSelfAttention(nn.Module):
    """Encoder attention: every token sees every token of its own prompt."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.head_dim = hidden // heads
        self.num_heads = heads // tp_size()
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        bounds = get_attention_metadata().cu_seqlens_q.tolist()
        q, k, v = self.qkv_proj(hidden).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        out = torch.empty_like(q)
        for start, end in itertools.pairwise(bounds):
            span = slice(start, end)
            out[span] = F.scaled_dot_product_attention(
                q[span].transpose(0, 1), k[span].transpose(0, 1), v[span].transpose(0, 1)
            ).transpose(0, 1)
        return out.reshape(hidden.shape[0], -1)


class BertLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.attention = BertSelfAttention(config)
        self.attention_output = RowParallelLinear(hidden, hidden, bias=True)
        self.attention_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.intermediate = ColumnParallelLinear(hidden, inner, bias=True)
        self.output = RowParallelLinear(inner, hidden, bias=True)
        self.output_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.act = get_activation(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.attention_norm(hidden + self.attention_output(self.attention(hidden)))
        return self.output_norm(hidden + self.output(self.act(self.intermediate(hidden))))


class BertModel(nn.Module):
    # checkpoint name part -> (our parameter name part, shard id)
    stacked_params = [
        ("attention.qkv_proj", "attention.self.query", "q"),
        ("attention.qkv_proj", "attention.self.key", "k"),
        ("attention.qkv_proj", "attention.self.value", "v"),
    ]
    _renames = (
        ("attention.output.dense", "attention_output"),
        ("attention.output.LayerNorm", "attention_norm"),
        ("intermediate.dense", "intermediate"),
        ("output.dense", "output"),
        ("output.LayerNorm", "output_norm"),
    )

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = Pooler("CLS", normalize=True)  # replaced by the loader from the model folder

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(input_ids, positions)
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        return self.pooler(hidden, cu_seqlens)

    def _rename(self, name: str) -> str | None:
        if name.startswith("bert."):
            name = name[len("bert.") :]
        if name.startswith(("pooler.", "cls.")) or name.endswith("position_ids"):
            return None
        name = name.replace("encoder.layer.", "layers.")
        for old, new in self._renames:
            if f".{old}." in name:
                return name.replace(f".{old}.", f".{new}.")
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_stacked_weights(self, weights, self.stacked_params, rename=self._rename)
