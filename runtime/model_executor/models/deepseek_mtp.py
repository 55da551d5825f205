"""DeepSeek's multi-token-prediction layer (``num_nextn_predict_layers``), run as a draft head:
the checkpoint's ``model.layers.{num_hidden_layers}.*`` (``enorm``, ``hnorm``, ``eh_proj``, one
decoder layer of the target's kind, ``shared_head.norm`` and ``shared_head.head``; its copy of
the embedding is the target's). It reads ``eh_proj([enorm(embedding of the next token),
hnorm(the target's hidden state)])`` through the decoder layer; its output before the head's
norm is fed back with the next guess."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor.layers.embedding import ParallelLMHead
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from infernetes.runtime.model_executor.models.deepseek import (
    DeepseekV2ForCausalLM,
    MultiHeadLatentAttention,
)
from infernetes.runtime.model_executor.models.llama import LlamaDecoderLayer
from infernetes.runtime.model_executor.models.moe import MoeForCausalLM
from torch import nn
from transformers import PretrainedConfig


class SharedHead(nn.Module):
    """The MTP layer's own final norm and LM head (``shared_head.norm``, ``shared_head.head``)."""

    def __init__(self, hidden: int, eps: float, vocab_size: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, eps)
        self.head = ParallelLMHead(vocab_size, hidden)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden_states))


class DeepseekMTP(DeepseekV2ForCausalLM):
    """Runs only as a draft head (``spec_decode/draft_model.py``), which gives it the target's
    embedding with ``share_target``. Loads like the target (MLA, DeepSeek's MoE)."""

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.tie_word_embeddings = self.shared_embedding = False
        hidden, eps = config.hidden_size, config.rms_norm_eps
        layer = config.num_hidden_layers  # the MTP layer's index in the checkpoint
        self.enorm, self.hnorm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = LlamaDecoderLayer(
            config,
            max_position,
            layer,
            self.mlp(layer),
            MultiHeadLatentAttention(config, max_position),
        )
        self.shared_head = SharedHead(hidden, eps, config.vocab_size)
        self._embedding: tuple[nn.Module] | None = None  # the target's, not registered

    def share_target(self, embedding: nn.Module, lm_head: nn.Module) -> None:
        self._embedding = (embedding,)

    def forward(  # type: ignore[override]  # a head's input: the hidden states too
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        assert self._embedding is not None, "share_target first"
        embeds = self._embedding[0](input_ids)
        # position 0's embedding is masked, as DeepSeek's MTP is run (vLLM's does the same)
        embeds = self.enorm(torch.where(positions.unsqueeze(-1) == 0, 0, embeds))
        x = self.eh_proj(torch.cat([embeds, self.hnorm(hidden_states)], dim=-1))
        x, residual = self.block(positions, x, None)
        return x + residual

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.shared_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        prefix = f"model.layers.{self.config.num_hidden_layers}."
        own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")

        def mtp_tensors() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if not name.startswith(prefix) or ".embed_tokens." in f".{name[len(prefix) :]}":
                    continue  # the target's layers; the embedding is the target's
                local = name[len(prefix) :]
                yield (local if local.startswith(own) else f"block.{local}"), tensor

        return MoeForCausalLM.load_weights(self, mtp_tensors())
