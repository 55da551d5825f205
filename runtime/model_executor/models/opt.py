"""OPT (facebook/opt-*): learned positions (offset 2), ReLU MLP, pre- or post-LayerNorm, optional
input/output projections when the embedding width differs from the hidden size."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor import parallel
from infernetes.runtime.model_executor.layers.activation import get_activation
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from infernetes.runtime.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.models.utils import (
    IntermediateTensors,
    PPMissingLayer,
    load_stacked_weights,
    on_first_stage,
    on_last_stage,
    stage_layers,
    tie_on_this_stage,
)
from infernetes.runtime.model_executor.parallel import tp_size
from torch import nn
from transformers import PretrainedConfig

# OPT's learned position table starts two rows in (a fairseq convention).
_POSITION_OFFSET = 2


class OPTAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        heads = config.num_attention_heads
        self.head_dim = hidden // heads
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias)
        self.out_proj = RowParallelLinear(hidden, hidden, bias)
        local_heads = heads // tp_size()
        self.attn = Attention(local_heads, self.head_dim, self.head_dim**-0.5, local_heads)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).chunk(3, dim=-1)
        return self.out_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous()))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        bias = getattr(config, "enable_bias", True)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.fc1 = ColumnParallelLinear(hidden, config.ffn_dim, bias)
        self.fc2 = RowParallelLinear(config.ffn_dim, hidden, bias)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.act = get_activation(config.activation_function)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = hidden
        if self.pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        hidden = residual + self.self_attn(hidden)
        if not self.pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        residual = hidden
        if self.pre_norm:
            hidden = self.final_layer_norm(hidden)
        hidden = residual + self.fc2(self.act(self.fc1(hidden)))
        if not self.pre_norm:
            hidden = self.final_layer_norm(hidden)
        return hidden


class OPTDecoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, embed_dim = config.hidden_size, config.word_embed_proj_dim
        projected = embed_dim != hidden
        self.embed_tokens = on_first_stage(
            lambda: VocabParallelEmbedding(config.vocab_size, embed_dim)
        )
        self.embed_positions = on_first_stage(
            lambda: nn.Embedding(config.max_position_embeddings + _POSITION_OFFSET, hidden)
        )
        self.project_in = (
            on_first_stage(lambda: ReplicatedLinear(embed_dim, hidden)) if projected else None
        )
        self.project_out = (
            on_last_stage(lambda: ReplicatedLinear(hidden, embed_dim)) if projected else None
        )
        use_final_norm = config.do_layer_norm_before and not getattr(
            config, "_remove_final_layer_norm", False
        )
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.final_layer_norm = (
            on_last_stage(lambda: nn.LayerNorm(hidden, elementwise_affine=affine))
            if use_final_norm
            else None
        )
        self.start, self.end, self.layers = stage_layers(
            config.num_hidden_layers, lambda _: OPTDecoderLayer(config)
        )
        self.is_last_stage = parallel.state().is_last_stage

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if intermediate is None:
            hidden = self.embed_tokens(input_ids)
            if self.project_in is not None:
                hidden = self.project_in(hidden)
            hidden = hidden + self.embed_positions(positions + _POSITION_OFFSET)
        else:
            hidden = intermediate["hidden"]
        for layer in self.layers[self.start : self.end]:
            hidden = layer(hidden)
        if not self.is_last_stage:
            return {"hidden": hidden}
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden


class OPTModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    stacked_params = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
    ]

    intermediate_names = ("hidden",)

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = on_last_stage(
            lambda: ParallelLMHead(config.vocab_size, config.word_embed_proj_dim)
        )
        # OPT always ties the output embedding, which may sit on another pipeline stage.
        self.shared_embedding = tie_on_this_stage(self.lm_head, self.model.decoder.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model.decoder(input_ids, positions, intermediate)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        embedding_elsewhere = isinstance(self.model.decoder.embed_tokens, PPMissingLayer)

        def rename(name: str) -> str:
            # Some checkpoints (e.g. facebook/opt-125m) name the decoder without "model.".
            name = name if name.startswith(("model.", "lm_head.")) else "model." + name
            if name == "model.decoder.embed_tokens.weight" and embedding_elsewhere:
                return "lm_head.weight"  # the tied head on a stage without the embedding
            return name

        # OPT's LM head is the embedding: a checkpoint's own copy of it is not read.
        weights = ((n, t) for n, t in weights if not n.startswith("lm_head."))
        loaded = load_stacked_weights(self, weights, self.stacked_params, (), rename)
        if self.shared_embedding:
            loaded.add("lm_head.weight")
        return loaded
