"""``XLMRobertaForSequenceClassification`` (and RoBERTa's): the cross-encoders most rerankers
ship as (bge-reranker, mxbai-rerank). BERT's encoder with RoBERTa's three differences: positions
count from ``pad_token_id + 1`` (RoBERTa numbers them after the padding index), a single token
type (its tokenizer writes pairs ``<s> a </s></s> b </s>`` with no segment ids), and the head
reads the ``<s>`` state through ``dense -> tanh -> out_proj`` instead of BERT's pooler."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.models.bert import BertModel
from torch import nn
from transformers import PretrainedConfig


class XLMRobertaForSequenceClassification(nn.Module):
    """``pool`` gives each prompt's classifier logits, raw (the server applies the activation)."""

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.roberta = BertModel(config, max_position)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, int(config.num_labels or 1))
        self.position_offset = int(config.pad_token_id) + 1

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.roberta(input_ids, positions + self.position_offset)

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        first_tokens = hidden[cu_seqlens[:-1].long()]
        return self.out_proj(torch.tanh(self.dense(first_tokens)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()

        def encoder_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                own = name.removeprefix("classifier.")
                if own != name:  # classifier.dense.*, classifier.out_proj.*
                    with torch.no_grad():
                        params[own].copy_(as_tensor(tensor))
                    loaded.add(own)
                else:
                    yield name.removeprefix("roberta."), tensor

        loaded |= {f"roberta.{name}" for name in self.roberta.load_weights(encoder_weights())}
        return loaded
