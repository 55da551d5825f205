"""EAGLE-1 draft head for the Llama family, in its published checkpoint layout (``fc.weight``,
``layers.0.*``; the embedding and LM head are the target's): one decoder layer over
``fc([embedding of the next token, the target's hidden state])``. Its output (no final norm)
goes to the target's LM head for a guess and, fed back with that guess, to the next position.
The first layer has no input norm, as in EAGLE's own code."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
)
from infernetes.runtime.model_executor.models.utils import load_stacked_weights
from torch import nn
from transformers import PretrainedConfig


class EagleLlamaForCausalLM(nn.Module):
    """Runs only as a draft head (``spec_decode/eagle.py``), which gives it the target's
    embedding and LM head with ``share_target``."""

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, max_position, i, LlamaMLP(config))
            for i in range(config.num_hidden_layers)
        )
        self.layers[0].input_layernorm = nn.Identity()
        # the target's modules, kept out of this module's parameters (a tuple is not registered)
        self._target: tuple[nn.Module, nn.Module] | None = None

    def share_target(self, embedding: nn.Module, lm_head: nn.Module) -> None:
        self._target = (embedding, lm_head)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        assert self._target is not None, "share_target first"
        embeds = self._target[0](input_ids)
        hidden = self.fc(torch.cat([embeds, hidden_states.to(embeds.dtype)], dim=-1))
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return hidden + residual

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        assert self._target is not None, "share_target first"
        return self._target[1](hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # a copy of the target's embedding or head, where a checkpoint carries one, is not read
        skip = ("embed_tokens.", "lm_head.", "rotary_emb.inv_freq")
        return load_stacked_weights(self, weights, LlamaForCausalLM.stacked_params, skip)
