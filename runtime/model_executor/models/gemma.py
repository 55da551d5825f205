"""The Gemma family: Gemma, Gemma 2 and Gemma 3 (text).

What sets them apart from Llama, each visible below:
- embeddings scaled by sqrt(hidden_size); RMSNorm multiplies by ``1 + weight``, in float32;
- a GeGLU MLP (tanh GELU of the gate times the up projection);
- Gemma 2 and 3 wrap attention and MLP each in a norm before and after
  (``h = x + post_norm(attention(pre_norm(x)))``), scale queries by ``query_pre_attn_scalar``,
  alternate sliding-window (local) and full (global) layers;
- Gemma 2 soft-caps attention scores and the final logits; Gemma 3 normalises queries and keys
  per head and gives local and global layers rope bases of their own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.embedding import VocabParallelEmbedding
from infernetes.runtime.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.layers.rotary import get_rope, rope_from_config
from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM
from infernetes.runtime.model_executor.models.utils import (
    IntermediateTensors,
    PPMissingLayer,
    layer_sliding_window,
    on_first_stage,
    on_last_stage,
    stage_layers,
)
from torch import nn
from transformers import PretrainedConfig


class GemmaRMSNorm(nn.Module):
    """``norm(x) * (1 + weight)`` in float32, cast back, as Gemma computes it (the checkpoint
    stores the weight's offset from one)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).to(x.dtype)


def _layer_type(config: PretrainedConfig, layer: int) -> str:
    layer_types = getattr(config, "layer_types", None)
    return layer_types[layer] if layer_types else "full_attention"


class GemmaAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int, layer: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, total_heads, total_kv_heads, bias)
        self.q_size = self.qkv_proj.num_heads * self.head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden, bias)
        self.qk_norm = config.model_type == "gemma3_text"
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        base, scaling = rope_from_config(config, _layer_type(config, layer))
        self.rotary_emb = get_rope(
            self.head_dim,
            self.head_dim,
            max_position,
            base,
            scaling,
            config.max_position_embeddings,
        )
        scalar = getattr(config, "query_pre_attn_scalar", None) or self.head_dim
        self.attn = Attention(
            self.qkv_proj.num_heads,
            self.head_dim,
            scalar**-0.5,
            self.qkv_proj.num_kv_heads,
            layer_sliding_window(config, layer),
            getattr(config, "attn_logit_softcapping", None),
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], -1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.q_size)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v.contiguous()))


class GemmaMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        if act not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"hidden_activation {act!r} is not supported for Gemma")
        self.approximate = "tanh" if act == "gelu_pytorch_tanh" else "none"
        size = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size, size])
        self.down_proj = RowParallelLinear(size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate=self.approximate) * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int, layer: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = GemmaAttention(config, max_position, layer)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        # Gemma 2 and 3 norm both sides of each block; Gemma norms only before
        self.sandwich = config.model_type != "gemma"
        if self.sandwich:
            self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
            self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if not self.sandwich:
            h = x + self.self_attn(positions, self.input_layernorm(x))
            return h + self.mlp(self.post_attention_layernorm(h))
        attended = self.self_attn(positions, self.input_layernorm(x))
        h = x + self.post_attention_layernorm(attended)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class GemmaModel(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.embed_tokens = on_first_stage(
            lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        )
        self.normalizer = config.hidden_size**0.5
        self.start, self.end, self.layers = stage_layers(
            config.num_hidden_layers, lambda i: GemmaDecoderLayer(config, max_position, i)
        )
        self.norm = on_last_stage(lambda: GemmaRMSNorm(config.hidden_size, config.rms_norm_eps))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings scaled by sqrt(hidden_size), the scale rounded to the model
        dtype first (transformers' scaled embedding)."""
        hidden = self.embed_tokens(input_ids)
        return hidden * torch.tensor(self.normalizer, dtype=hidden.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if intermediate is None:
            # given embeddings are taken as they are (already scaled, as transformers' are)
            hidden = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        else:
            hidden = intermediate["hidden"]
        for layer in self.layers[self.start : self.end]:
            hidden = layer(positions, hidden)
        if isinstance(self.norm, PPMissingLayer):
            return {"hidden": hidden}
        return self.norm(hidden)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma, Gemma2ForCausalLM and Gemma3ForCausalLM: Llama's weight layout and tied head."""

    intermediate_names = ("hidden",)

    def build_model(self, config: PretrainedConfig, max_position: int) -> nn.Module:
        return GemmaModel(config, max_position)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        model: GemmaModel = self.model  # type: ignore[assignment]  # build_model made it
        return model.embed(input_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden_states)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits
