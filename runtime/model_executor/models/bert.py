"""BERT encoder for embeddings (``--task embed``): bidirectional attention over each whole prompt,
post-LayerNorm, then the pooler the model folder declares. No KV cache: a prompt is encoded in one
step. ``BertForSequenceClassification`` is the same encoder over a text pair (a cross-encoder),
its CLS state through BERT's pooler and a classifier: one row of logits per prompt."""

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
from infernetes.runtime.model_executor.lazy_weight import as_tensor
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

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        token_types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_types is None:
            hidden = hidden + self.token_type_embeddings.weight[0]  # one segment: token type 0
        else:
            hidden = hidden + self.token_type_embeddings(token_types)
        return self.LayerNorm(hidden)


def pair_token_types(
    input_ids: torch.Tensor, sep_token_id: int, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """BERT's segment ids of pairs packed ``[CLS] a [SEP] b [SEP]`` (what its tokenizer writes):
    0 up to and including each sequence's first [SEP], 1 after it. The engine passes token ids
    only; the segments follow from them."""
    is_sep = (input_ids == sep_token_id).long()
    seps_before = torch.cumsum(is_sep, 0) - is_sep
    starts = cu_seqlens[:-1].long()
    in_earlier_sequences = torch.repeat_interleave(seps_before[starts], cu_seqlens.diff().long())
    return (seps_before > in_earlier_sequences).long()


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

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        token_types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.embeddings(input_ids, positions, token_types)
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


class BertForSequenceClassification(nn.Module):
    """A cross-encoder: ``pool`` gives each prompt's classifier logits, raw (the server applies
    the activation its route asks for). The engine's pooler, set by the loader, is not used."""

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.bert = BertModel(config, max_position)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, int(config.num_labels or 1))
        # set from the tokenizer when config.json has none (engine_config)
        self.sep_token_id: int | None = getattr(config, "sep_token_id", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        token_types = None
        if self.sep_token_id is not None:
            cu_seqlens = get_attention_metadata().cu_seqlens_q
            token_types = pair_token_types(input_ids, self.sep_token_id, cu_seqlens)
        return self.bert(input_ids, positions, token_types)

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        first_tokens = hidden[cu_seqlens[:-1].long()]
        return self.classifier(torch.tanh(self.dense(first_tokens)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()

        def encoder_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                own = name.replace("bert.pooler.dense.", "dense.")
                if own.startswith(("dense.", "classifier.")):
                    with torch.no_grad():
                        params[own].copy_(as_tensor(tensor))
                    loaded.add(own)
                else:
                    yield name, tensor

        loaded |= {f"bert.{name}" for name in self.bert.load_weights(encoder_weights())}
        return loaded
