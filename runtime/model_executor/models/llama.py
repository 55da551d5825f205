"""The Llama family: Llama (all rope scalings), Mistral, Qwen2 (QKV bias) and Qwen3 (QK norm)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from infernetes.runtime.model_executor.layers.activation import SiluAndMul
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from infernetes.runtime.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.layers.norm import RMSNorm
from infernetes.runtime.model_executor.layers.rotary import get_rope, rope_from_config
from infernetes.runtime.model_executor.models.utils import (
    IntermediateTensors,
    PPMissingLayer,
    layer_sliding_window,
    load_stacked_weights,
    on_first_stage,
    on_last_stage,
    stage_layers,
    tie_on_this_stage,
)
from torch import nn
from transformers import PretrainedConfig


def _attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
    """Whether the QKV and the output projections have biases: Qwen2 always has a QKV bias
    (Qwen2-MoE as its ``qkv_bias`` says) and no output bias; the others follow attention_bias."""
    if config.model_type in ("qwen2", "qwen2_vl_text", "qwen2_5_vl_text"):
        return True, False
    if config.model_type == "qwen2_moe":
        return bool(getattr(config, "qkv_bias", True)), False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


class LlamaAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, max_position: int, layer: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // total_heads
        qkv_bias, output_bias = _attention_biases(config)
        self.qkv_proj = QKVParallelLinear(
            hidden, self.head_dim, total_heads, total_kv_heads, qkv_bias
        )
        self.num_heads = self.qkv_proj.num_heads  # this rank's share
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden, output_bias)
        base, scaling = rope_from_config(config)
        partial = getattr(config, "partial_rotary_factor", None) or (
            getattr(config, "rope_parameters", None) or {}
        ).get("partial_rotary_factor", 1.0)
        rotary_dim = int(self.head_dim * partial)
        self.rotary_emb = get_rope(
            self.head_dim, rotary_dim, max_position, base, scaling, config.max_position_embeddings
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            self.num_kv_heads,
            layer_sliding_window(config, layer),
        )
        self.qk_norm = config.model_type in (
            "qwen3",
            "qwen3_moe",
            "qwen3_vl_text",
            "qwen3_vl_moe_text",
        )
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.q_size)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v.contiguous()))


class LlamaMLP(nn.Module):
    def __init__(self, config: PretrainedConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported by this model; only 'silu'")
        bias = getattr(config, "mlp_bias", False)
        size = intermediate_size or config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size, size], bias)
        self.down_proj = RowParallelLinear(size, config.hidden_size, bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        max_position: int,
        layer: int,
        mlp: nn.Module,
        attention: nn.Module | None = None,
    ) -> None:
        super().__init__()
        # Llama's attention, or a family's own with the same (positions, hidden) interface
        self.self_attn = attention or LlamaAttention(config, max_position, layer)
        self.mlp = mlp  # dense, or a mixture of experts
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        max_position: int,
        mlp: Callable[[int], nn.Module],
        attention: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = on_first_stage(
            lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        )
        self.start, self.end, self.layers = stage_layers(
            config.num_hidden_layers,
            lambda i: LlamaDecoderLayer(
                config, max_position, i, mlp(i), attention(i) if attention else None
            ),
        )
        self.norm = on_last_stage(lambda: RMSNorm(config.hidden_size, config.rms_norm_eps))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        hidden, residual = self.stage_input(input_ids, intermediate, inputs_embeds)
        for layer in self.layers[self.start : self.end]:
            hidden, residual = layer(positions, hidden, residual)
        return self.stage_output(hidden, residual)

    def stage_input(
        self,
        input_ids: torch.Tensor,
        intermediate: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This stage's first layer's input: the embeddings, or the previous stage's output."""
        if intermediate is None:
            hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
            return hidden, None
        return intermediate["hidden"], intermediate["residual"]

    def stage_output(
        self, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor | IntermediateTensors:
        """The normed hidden states on the last stage, else what the next stage goes on from."""
        if isinstance(self.norm, PPMissingLayer):
            assert residual is not None
            return {"hidden": hidden, "residual": residual}
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Also serves MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM (same layout)."""

    stacked_params = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    intermediate_names: tuple[str, ...] = ("hidden", "residual")
    supports_inputs_embeds = True  # models/interfaces.SupportsInputsEmbeds

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.model = self.build_model(config, max_position)
        self.lm_head = on_last_stage(lambda: ParallelLMHead(config.vocab_size, config.hidden_size))
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        # With pipeline stages, a tied LM head and the embedding may sit on different ranks.
        embedding: nn.Module = self.model.embed_tokens  # type: ignore[assignment]  # every family names it so
        self.shared_embedding = self.tie_word_embeddings and tie_on_this_stage(
            self.lm_head, embedding
        )

    def build_model(self, config: PretrainedConfig, max_position: int) -> nn.Module:
        return LlamaModel(config, max_position, self.mlp)

    def mlp(self, layer: int) -> nn.Module:
        """The feed-forward block of decoder layer ``layer``."""
        return LlamaMLP(self.config)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        embedding: nn.Module = self.model.embed_tokens  # type: ignore[assignment]  # every family names it so
        return embedding(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        skip: tuple[str, ...] = (
            "rotary_emb.inv_freq",
            "rotary_emb.cos_cached",
            "rotary_emb.sin_cached",
        )
        if self.shared_embedding:
            skip += ("lm_head.weight",)  # the embedding's tensor is the LM head's

        def rename(name: str) -> str:
            # A tied LM head on a pipeline stage without the embedding loads the embedding's tensor.
            if (
                self.tie_word_embeddings
                and name == "model.embed_tokens.weight"
                and isinstance(self.model.embed_tokens, PPMissingLayer)
            ):
                return "lm_head.weight"
            return name

        loaded = load_stacked_weights(self, weights, self.stacked_params, skip, rename)
        if self.shared_embedding:
            loaded.add("lm_head.weight")
        return loaded


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 and Phi-4: Llama's layers, with the checkpoint's projections already fused
    (``qkv_proj``, ``gate_up_proj``) and LongRoPE scaling. The fused tensors are cut into their
    parts, so each rank's loader takes its own slice of each part."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        config = self.config
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        q = config.num_attention_heads * head_dim
        kv = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * head_dim

        def split(items):
            for name, tensor in items:
                if name.endswith("qkv_proj.weight"):
                    prefix = name.removesuffix("qkv_proj.weight")
                    yield prefix + "q_proj.weight", tensor.narrow(0, 0, q)
                    yield prefix + "k_proj.weight", tensor.narrow(0, q, kv)
                    yield prefix + "v_proj.weight", tensor.narrow(0, q + kv, kv)
                elif name.endswith("gate_up_proj.weight"):
                    prefix = name.removesuffix("gate_up_proj.weight")
                    gate, up = tensor.chunk(2, 0)
                    yield prefix + "gate_proj.weight", gate
                    yield prefix + "up_proj.weight", up
                else:
                    yield name, tensor

        return super().load_weights(split(weights))
