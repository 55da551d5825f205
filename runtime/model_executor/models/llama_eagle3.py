"""EAGLE-3 draft head for the Llama family, in its published checkpoint layout (``fc.weight``,
``midlayer.*`` with ``hidden_norm``, ``norm.weight``, ``lm_head.weight`` over its own draft
vocabulary and ``d2t``, each draft id's offset to its target id; ``t2d`` is not needed).

``fc`` folds the target's hidden states after three of its layers (``aux_layer_ids``) into one;
the midlayer attends over ``[input_norm(embedding of the next token), hidden_norm(hidden)]``
(twice the width into its QKV projection), keeping the hidden state as its residual. Its output
before the final norm is fed back with the next guess; after it, the LM head guesses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from infernetes.runtime.model_executor.layers.embedding import ParallelLMHead
from infernetes.runtime.model_executor.layers.linear import QKVParallelLinear
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from infernetes.runtime.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    _attention_biases,
)
from infernetes.runtime.model_executor.models.utils import load_stacked_weights
from torch import nn
from transformers import PretrainedConfig


def aux_layer_ids(head_config: PretrainedConfig, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose input hidden states the head reads: its config's
    ``eagle_config.eagle_aux_hidden_state_layer_ids``, else vLLM's default for Llama."""
    given = (getattr(head_config, "eagle_config", None) or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if given:
        return tuple(given)
    return (2, num_target_layers // 2, num_target_layers - 3)


class Eagle3LlamaForCausalLM(nn.Module):
    """Runs only as a draft head (``spec_decode/draft_model.py``), which gives it the target's
    embedding with ``share_target``."""

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        target_hidden = getattr(config, "target_hidden_size", None) or hidden
        self.vocab_size = config.vocab_size
        draft_vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.fc = nn.Linear(3 * target_hidden, hidden, bias=False)
        layer = LlamaDecoderLayer(config, max_position, 0, LlamaMLP(config))
        attention: LlamaAttention = layer.self_attn  # type: ignore[assignment]  # Llama's own
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        attention.qkv_proj = QKVParallelLinear(
            2 * hidden, attention.head_dim, heads, kv_heads, _attention_biases(config)[0]
        )
        layer.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = ParallelLMHead(draft_vocab, hidden)
        self.d2t = nn.Parameter(torch.zeros(draft_vocab, dtype=torch.long), requires_grad=False)
        self._embedding: tuple[nn.Module] | None = None  # the target's, not registered

    def share_target(self, embedding: nn.Module, lm_head: nn.Module) -> None:
        self._embedding = (embedding,)

    def combine_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's three hidden states of each position ``[T, 3 * H]`` folded into one."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        assert self._embedding is not None, "share_target first"
        layer: Any = self.layers[0]  # a LlamaDecoderLayer with a hidden_norm
        embeds = layer.input_layernorm(self._embedding[0](input_ids))
        residual = hidden_states
        x = torch.cat([embeds, layer.hidden_norm(hidden_states)], dim=-1)
        x, residual = layer.post_attention_layernorm(layer.self_attn(positions, x), residual)
        return layer.mlp(x) + residual

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary: each draft id's at its target id, -inf where
        the draft vocabulary has no token."""
        draft = self.lm_head(self.norm(hidden_states))
        logits = draft.new_full((draft.shape[0], self.vocab_size), float("-inf"))
        targets = torch.arange(draft.shape[-1], device=draft.device) + self.d2t
        logits[:, targets] = draft
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        skip = ("embed_tokens.", "t2d", "rotary_emb.inv_freq")
        return load_stacked_weights(
            self,
            weights,
            LlamaForCausalLM.stacked_params,
            skip,
            lambda name: name.replace("midlayer.", "layers.0."),
        )
