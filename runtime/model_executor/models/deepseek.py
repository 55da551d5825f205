"""DeepSeek-V2 and DeepSeek-V3: multi-head latent attention (MLA) and DeepSeek's mixture of experts.

Attention. Each token's keys and values come from one low-rank latent: ``kv_a_proj_with_mqa``
gives the compressed ``c`` (``kv_lora_rank``, RMS-normed) and a key part ``k_pe``
(``qk_rope_head_dim``) shared by every head and rotated by rope; ``kv_b_proj`` would expand ``c``
into each head's ``k_nope`` and ``v``. The cache keeps only ``[c, k_pe]`` per token. The
expansion is absorbed instead (``W_UK``, ``W_UV`` are ``kv_b_proj``'s two halves per head):

    q_nope . k_nope = (q_nope W_UK) . c      so each head's query becomes [q_nope W_UK, q_pe]
    softmax(...) v  = (softmax(...) c) W_UV^T

which is multi-query attention over the latent cache (`LatentAttention`). Queries come from
``q_proj``, or (``q_lora_rank`` set) through ``q_a_proj``, ``q_a_layernorm`` and ``q_b_proj``.
Rope rotates the rope parts only, in the checkpoint's interleaved-pair layout (GPT-J style;
V3 with ``rope_interleave: false`` uses the halves layout); with yarn scaling the softmax scale
takes ``mscale(factor, mscale_all_dim)**2`` on top of ``1/sqrt(qk_head_dim)``.

Feed-forward. The first ``first_k_dense_replace`` layers (and those off ``moe_layer_freq``) are
dense; the rest route each token to ``num_experts_per_tok`` of ``n_routed_experts`` experts (see
`layers.deepseek_routing`) and add ``n_shared_experts`` shared experts every token goes through:

    h = sum_k weight_k * expert_k(x) + shared(x)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor.layers import deepseek_routing as routing
from infernetes.runtime.model_executor.layers.attention import LatentAttention
from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE
from infernetes.runtime.model_executor.layers.linear import (
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from infernetes.runtime.model_executor.layers.rotary import get_rope, rope_from_config
from infernetes.runtime.model_executor.models.llama import LlamaMLP, LlamaModel
from infernetes.runtime.model_executor.models.moe import MoeForCausalLM, RouterLinear
from torch import nn
from transformers import PretrainedConfig


class UnquantizedColumnParallelLinear(ColumnParallelLinear):
    """``kv_b_proj``: its weight is read as ``W_UK``/``W_UV`` (absorbed into the queries and the
    attention output), never multiplied as a linear layer, so it stays a plain tensor (and no LoRA target)."""

    lora_targetable = False
    reads_dense_weight = True

    def quantize_fp8(self) -> None:
        pass

    def pack_for_cpu(self) -> None:
        pass


class Float32Router(RouterLinear):
    """DeepSeek's router: logits computed in float32 whatever the model dtype, as DeepSeek's
    reference does (a near tie between experts otherwise flips with bf16 rounding). Not a LoRA
    target (as in vLLM): it carries the V3 correction bias the routing reads."""

    lora_targetable = False
    reads_dense_weight = True  # multiplied in float32 here, not by the layer's own matmul

    def pack_for_cpu(self) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.float(), self.weight.float())


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(config: PretrainedConfig, qk_head_dim: int) -> float:
    """``1/sqrt(qk_head_dim)``, times ``mscale(factor, mscale_all_dim)**2`` under yarn."""
    scale = qk_head_dim**-0.5
    _, scaling = rope_from_config(config)
    if scaling and scaling.get("mscale_all_dim"):
        scale *= _yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"])) ** 2
    return scale


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        self.nope_dim = config.qk_nope_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        qk_head_dim = self.nope_dim + self.rope_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, total_heads * qk_head_dim)
        else:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, 1e-6)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, total_heads * qk_head_dim)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.kv_lora_rank + self.rope_dim, bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, 1e-6)
        self.kv_b_proj = UnquantizedColumnParallelLinear(
            self.kv_lora_rank, total_heads * (self.nope_dim + self.v_dim)
        )
        self.num_heads = self.kv_b_proj.output_size // (self.nope_dim + self.v_dim)  # this rank's
        self.o_proj = RowParallelLinear(total_heads * self.v_dim, hidden, bias)
        base, scaling = rope_from_config(config)
        interleaved = config.model_type == "deepseek_v2" or getattr(config, "rope_interleave", True)
        self.rotary_emb = get_rope(
            self.rope_dim,
            self.rope_dim,
            max_position,
            base,
            scaling,
            config.max_position_embeddings,
            is_neox=not interleaved,
        )
        self.attn = LatentAttention(
            self.num_heads, self.kv_lora_rank, self.rope_dim, softmax_scale(config, qk_head_dim)
        )

    def _absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_UK [H, nope, kv_lora_rank], W_UV [H, v, kv_lora_rank])`` from ``kv_b_proj``."""
        per_head = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, -1)
        return per_head[:, : self.nope_dim], per_head[:, self.nope_dim :]

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q_nope, q_pe = q.view(tokens, self.num_heads, -1).split([self.nope_dim, self.rope_dim], -1)
        c, k_pe = self.kv_a_proj_with_mqa(hidden_states).split(
            [self.kv_lora_rank, self.rope_dim], -1
        )
        q_pe, k_pe = self.rotary_emb(positions, q_pe.reshape(tokens, -1), k_pe.contiguous())
        w_uk, w_uv = self._absorbed()
        query = torch.cat(
            [
                torch.einsum("thn,hnl->thl", q_nope, w_uk),
                q_pe.view(tokens, self.num_heads, self.rope_dim),
            ],
            dim=-1,
        )
        latent = torch.cat([self.kv_a_layernorm(c.contiguous()), k_pe], dim=-1)
        out = self.attn(query, latent)  # [T, H, kv_lora_rank]
        out = torch.einsum("thl,hvl->thv", out, w_uv).reshape(tokens, -1)
        return self.o_proj(out)


class DeepseekMoE(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.scaling = float(getattr(config, "routed_scaling_factor", 1.0) or 1.0)
        self.topk_method = getattr(config, "topk_method", None) or (
            "noaux_tc" if config.model_type == "deepseek_v3" else "greedy"
        )
        if self.topk_method not in routing.TOPK_METHODS:
            raise ValueError(
                f"topk_method {self.topk_method!r} is not supported; "
                f"allowed: {', '.join(routing.TOPK_METHODS)}"
            )
        scoring = getattr(config, "scoring_func", None)
        expected = "sigmoid" if self.topk_method == "noaux_tc" else "softmax"
        if scoring not in (None, expected):
            raise ValueError(
                f"scoring_func {scoring!r} with topk_method {self.topk_method!r} is not supported; "
                f"that method scores with {expected!r}"
            )
        num_experts = config.n_routed_experts
        self.n_group = getattr(config, "n_group", None)
        self.topk_group = getattr(config, "topk_group", None)
        if self.topk_method != "greedy" and not (self.n_group and self.topk_group):
            raise ValueError(f"topk_method {self.topk_method!r} needs n_group and topk_group")
        if self.n_group and num_experts % self.n_group:
            raise ValueError(
                f"n_routed_experts ({num_experts}) is not divisible by n_group ({self.n_group})"
            )
        self.renormalize = bool(getattr(config, "norm_topk_prob", False))
        self.gate = Float32Router(config.hidden_size, num_experts)
        if self.topk_method == "noaux_tc":
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(num_experts), requires_grad=False
            )
        self.experts = FusedMoE(
            num_experts, self.top_k, config.hidden_size, config.moe_intermediate_size, False
        )
        shared = getattr(config, "n_shared_experts", None) or 0
        self.shared_experts = (
            LlamaMLP(config, config.moe_intermediate_size * shared) if shared else None
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(x)
        if self.topk_method == "noaux_tc":
            assert self.n_group and self.topk_group
            bias = self.gate.e_score_correction_bias
            assert isinstance(bias, torch.Tensor)
            return routing.sigmoid_biased_group_topk(
                logits,
                bias,
                self.top_k,
                self.scaling,
                self.n_group,
                self.topk_group,
                self.renormalize,
            )
        grouped = self.topk_method == "group_limited_greedy"
        return routing.softmax_topk(
            logits,
            self.top_k,
            self.scaling,
            self.n_group if grouped else None,
            self.topk_group if grouped else None,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = self.experts.run_experts(x, weights.to(torch.float32), ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekV2ForCausalLM(MoeForCausalLM):
    """MLA in every layer, DeepSeek's MoE in the sparse ones."""

    stacked_params = [
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    def build_model(self, config: PretrainedConfig, max_position: int) -> nn.Module:
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported; only 'silu'")
        return LlamaModel(
            config,
            max_position,
            self.mlp,
            attention=lambda layer: MultiHeadLatentAttention(config, max_position),
        )

    def mlp(self, layer: int) -> nn.Module:
        config = self.config
        freq = getattr(config, "moe_layer_freq", 1) or 1
        first_dense = getattr(config, "first_k_dense_replace", 0) or 0
        if config.n_routed_experts and layer >= first_dense and layer % freq == 0:
            return DeepseekMoE(config)
        return LlamaMLP(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # DeepSeek-V3 checkpoints carry a multi-token-prediction layer after the last decoder
        # layer (num_nextn_predict_layers): a draft head (deepseek_mtp.py), not the target's.
        extra = f"model.layers.{self.config.num_hidden_layers}."
        return super().load_weights((n, t) for n, t in weights if not n.startswith(extra))


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """V2's layers; the config picks V3's routing (``noaux_tc``) and rope layout."""
