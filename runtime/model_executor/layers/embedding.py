"""Vocabulary embedding and LM head, split over the vocabulary for tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infernetes.kernels.cpu import packed_linear, skinny_linear
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.parallel import (
    all_gather_last_dim,
    all_reduce,
    tp_rank,
    tp_size,
)
from torch import nn


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.tp_size = tp_size()
        self.shard_size = -(-num_embeddings // self.tp_size)
        self.start = tp_rank() * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
        # The table as stored (a GGUF file's blocks), when kept so (quantization/kept.py).
        self.quantized: GroupQuantWeight | None = None

    def keep_quantized(self, table: GroupQuantWeight) -> None:
        """Hold the table as stored in place of the dense weight (one rank only)."""
        self.quantized = table
        self.weight = nn.Parameter(self.weight.data.new_empty(0), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        shard = loaded[self.start : self.start + self.shard_size]
        param.data[: shard.shape[0]].copy_(as_tensor(shard))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:  # only the rows looked up are dequantised
            rows = self.quantized.select_outputs(input_ids.reshape(-1))
            return rows.dequantize(self.weight.dtype).reshape(*input_ids.shape, -1)
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mask = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * mask.unsqueeze(-1)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.shard_size), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self.packed_weight: torch.Tensor | None = None

    def tie(self, embedding: nn.Module) -> None:
        assert isinstance(embedding, VocabParallelEmbedding)  # the models pass theirs untyped
        self.weight = embedding.weight

    def pack_for_cpu(self) -> None:
        """Pack the (often tied) weight for oneDNN; the embedding keeps its own plain copy."""
        self.packed_weight = packed_linear.pack_weight(self.weight.data)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, vocab]`` for the rows given (only those that are sampled)."""
        if self.quantized is not None:
            logits = self.quantized(hidden_states, self.bias)
        elif self.packed_weight is not None:  # oneDNN's is as fast for bf16 (skinny_linear.py)
            logits = packed_linear.linear(hidden_states, self.packed_weight, self.bias)
        elif skinny_linear.handles(hidden_states, self.weight):
            logits = skinny_linear.linear(hidden_states, self.weight, self.bias)
        else:
            logits = F.linear(hidden_states, self.weight, self.bias)
        return all_gather_last_dim(logits)[..., : self.num_embeddings]
