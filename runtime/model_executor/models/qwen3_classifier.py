"""``Qwen3ForSequenceClassification``: a Qwen3 decoder that scores each prompt at its last token.

Two checkpoints take this shape. A sequence-classification checkpoint (transformers'
``Qwen3ForSequenceClassification``, such as the converted ``*-seq-cls`` rerankers) has a
``score`` matrix ``[num_labels, hidden]``. The original Qwen3-Reranker is a causal LM that
answers "yes" or "no"; vLLM serves it as a classifier with

    --hf-overrides '{"architectures": ["Qwen3ForSequenceClassification"],
                     "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}'

and so does this class: the score row is ``lm_head[yes] - lm_head[no]``, so the sigmoid of the
one logit is the softmax probability of "yes" over the two (what the model card computes). The
prompt is the reranker's own template, written by the client into text_1/text_2 (the tokenizer
joins a pair without separators).

No KV cache, as for the other pooling models: each prompt is whole in its step and attends
causally within itself (``Attention.without_cache``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.models.llama import (
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
)
from infernetes.runtime.model_executor.models.utils import load_stacked_weights
from torch import nn
from transformers import PretrainedConfig


def classifier_rows(config: PretrainedConfig, lm_head: torch.Tensor) -> torch.Tensor:
    """The score matrix made from LM-head rows (``config.classifier_token_ids``, resolved from
    ``classifier_from_token`` with the tokenizer): ``yes - no`` for the original reranker, else
    one label per token."""
    rows = lm_head[list(config.classifier_token_ids)].float()
    if getattr(config, "is_original_qwen3_reranker", False):
        no, yes = rows
        return (yes - no).unsqueeze(0)
    return rows


class Qwen3ForSequenceClassification(nn.Module):
    stacked_params = LlamaForCausalLM.stacked_params

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, max_position, lambda _: LlamaMLP(config))
        for module in self.model.modules():
            if isinstance(module, Attention):
                if module.sliding_window or module.softcap or module.sinks is not None:
                    raise ValueError(
                        "Qwen3ForSequenceClassification: sliding-window, soft-capped or sink attention "
                        "is not supported for scoring"
                    )
                module.without_cache = True
        self.score = nn.Linear(config.hidden_size, int(config.num_labels or 1), bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        last_tokens = hidden[cu_seqlens[1:].long() - 1]
        return self.score(last_tokens.to(self.score.weight.dtype))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from_tokens = getattr(self.config, "classifier_token_ids", None) is not None
        heads: dict[str, torch.Tensor] = {}

        def decoder_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name in ("lm_head.weight", "model.embed_tokens.weight"):
                    heads[name] = tensor
                if name in ("lm_head.weight", "score.weight"):
                    if name == "score.weight" and not from_tokens:
                        yield name, tensor
                    continue
                yield name, tensor

        skip = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
        loaded = load_stacked_weights(self, decoder_weights(), self.stacked_params, skip)
        if from_tokens:
            # a tied checkpoint (Qwen3-Reranker-0.6B) has no lm_head: the embedding is the head
            head = heads.get("lm_head.weight", heads.get("model.embed_tokens.weight"))
            if head is None:
                raise ValueError("classifier_from_token needs lm_head.weight in the checkpoint")
            with torch.no_grad():
                self.score.weight.copy_(classifier_rows(self.config, as_tensor(head)))
            loaded.add("score.weight")
        return loaded
