"""Mixture-of-experts members of the Llama family: Qwen2-MoE, Qwen3-MoE and Mixtral.

Attention, norms and the residual stream are Llama's; the feed-forward block is a router that
picks ``num_experts_per_tok`` experts per token, plus (Qwen2-MoE) a shared expert every token
goes through, scaled by its own sigmoid gate:

    h = experts(x, router(x)) + sigmoid(shared_gate(x)) * shared_expert(x)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from infernetes.runtime.model_executor.layers.fused_moe import EXPERT_PROJECTIONS, FusedMoE
from infernetes.runtime.model_executor.layers.linear import ReplicatedLinear
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM, LlamaMLP
from infernetes.runtime.model_executor.models.utils import missing_prefixes
from torch import nn
from transformers import PretrainedConfig

# "model.layers.3.mlp.experts.17.gate_proj.weight" -> ("model.layers.3.mlp", 17, "gate_proj")
EXPERT_TENSOR = re.compile(r"^(.*)\.experts\.(\d+)\.(\w+)\.weight$")


class RouterLinear(ReplicatedLinear):
    """The router's projection: left in the model dtype under ``--quantization fp8`` (as vLLM
    leaves it), since a small error there changes which experts a token goes to."""

    def quantize_fp8(self) -> None:
        pass


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        num_experts: int,
        intermediate_size: int,
        renormalize: bool,
        shared_expert_size: int = 0,
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.gate = RouterLinear(hidden, num_experts)
        self.experts = FusedMoE(
            num_experts, config.num_experts_per_tok, hidden, intermediate_size, renormalize
        )
        self.shared_expert: nn.Module | None = None
        if shared_expert_size:
            self.shared_expert = LlamaMLP(config, shared_expert_size)
            self.shared_expert_gate = ReplicatedLinear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, router_logits=self.gate(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class MoeForCausalLM(LlamaForCausalLM):
    """The shared weight loading: expert tensors go to their stacked parameters, the rest as in
    Llama. Subclasses say which layers are sparse and how their router normalises."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = set()
        params = dict(self.named_parameters())
        elsewhere = missing_prefixes(self)

        def dense(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in items:
                name = self.checkpoint_name(name)
                match = EXPERT_TENSOR.match(name)
                if match is None or match.group(3) not in EXPERT_PROJECTIONS:
                    yield name, tensor
                    continue
                if name.startswith(elsewhere):  # another pipeline stage's layer
                    continue
                prefix, expert, projection = match.groups()
                shard = EXPERT_PROJECTIONS[projection]
                target = f"{prefix}.experts.{'w2' if shard == 'w2' else 'w13'}_weight"
                if target not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no matching model parameter")
                param = params[target]
                param.weight_loader(param, tensor, shard, int(expert))  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
                loaded.add(target)

        loaded_dense = super().load_weights(dense(weights))  # runs dense(), loading the experts
        return loaded | loaded_dense

    def checkpoint_name(self, name: str) -> str:
        return name


class Qwen2MoeForCausalLM(MoeForCausalLM):
    """Also Qwen3MoeForCausalLM: the same block without the shared expert, normalised top-k."""

    def mlp(self, layer: int) -> nn.Module:
        config = self.config
        sparse_step = getattr(config, "decoder_sparse_step", 1) or 1
        if layer in (getattr(config, "mlp_only_layers", None) or []) or (layer + 1) % sparse_step:
            return LlamaMLP(config)
        return SparseMoeBlock(
            config,
            config.num_experts,
            config.moe_intermediate_size,
            bool(getattr(config, "norm_topk_prob", False)),
            getattr(config, "shared_expert_intermediate_size", 0) or 0,
        )


class MixtralForCausalLM(MoeForCausalLM):
    """Every layer sparse, top-k renormalised; the checkpoint calls the block
    ``block_sparse_moe`` and the projections w1 (gate), w3 (up), w2 (down)."""

    def mlp(self, layer: int) -> nn.Module:
        config = self.config
        return SparseMoeBlock(config, config.num_local_experts, config.intermediate_size, True)

    def checkpoint_name(self, name: str) -> str:
        return name.replace(".block_sparse_moe.", ".mlp.")
