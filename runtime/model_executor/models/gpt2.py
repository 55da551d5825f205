"""GPT-2: learned positions, pre-LayerNorm, GELU (tanh) MLP; checkpoints store Conv1D weights
transposed (``[in, out]``), so they are flipped on load."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from infernetes.runtime.model_executor.layers.activation import get_activation
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from infernetes.runtime.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.models.utils import (
    IntermediateTensors,
    PPMissingLayer,
    default_weight_loader,
    missing_prefixes,
    on_first_stage,
    on_last_stage,
    stage_layers,
    tie_on_this_stage,
)
from infernetes.runtime.model_executor.parallel import tp_size
from torch import nn
from transformers import PretrainedConfig

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class GPT2Attention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        heads = config.num_attention_heads
        self.head_dim = hidden // heads
        self.c_attn = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias=True)
        self.c_proj = RowParallelLinear(hidden, hidden, bias=True)
        scale = self.head_dim**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        local_heads = heads // tp_size()
        self.attn = Attention(local_heads, self.head_dim, scale, local_heads)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(hidden).chunk(3, dim=-1)
        return self.c_proj(self.attn(q.contiguous(), k.contiguous(), v.contiguous()))


class GPT2Block(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        inner = config.n_inner or 4 * hidden
        self.ln_1 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.c_fc = ColumnParallelLinear(hidden, inner, bias=True)
        self.c_proj = RowParallelLinear(inner, hidden, bias=True)
        self.act = get_activation(config.activation_function)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden))
        return hidden + self.c_proj(self.act(self.c_fc(self.ln_2(hidden))))


class GPT2Model(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.wte = on_first_stage(lambda: VocabParallelEmbedding(config.vocab_size, hidden))
        self.wpe = on_first_stage(lambda: nn.Embedding(config.max_position_embeddings, hidden))
        self.start, self.end, self.h = stage_layers(
            config.num_hidden_layers, lambda _: GPT2Block(config)
        )
        self.ln_f = on_last_stage(lambda: nn.LayerNorm(hidden, eps=config.layer_norm_epsilon))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if intermediate is None:
            hidden = self.wte(input_ids) + self.wpe(positions)
        else:
            hidden = intermediate["hidden"]
        for block in self.h[self.start : self.end]:
            hidden = block(hidden)
        if isinstance(self.ln_f, PPMissingLayer):
            return {"hidden": hidden}
        return self.ln_f(hidden)


class GPT2LMHeadModel(nn.Module):
    intermediate_names = ("hidden",)

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = on_last_stage(lambda: ParallelLMHead(config.vocab_size, config.hidden_size))
        # GPT-2 ties its LM head to the token embedding, which may sit on another stage.
        self.shared_embedding = tie_on_this_stage(self.lm_head, self.transformer.wte)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.transformer(input_ids, positions, intermediate)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        elsewhere = missing_prefixes(self)  # held by other pipeline stages
        loaded: set[str] = {"lm_head.weight"} if self.shared_embedding else set()
        for name, tensor in weights:
            if name.startswith("lm_head.") or name.endswith((".attn.bias", ".attn.masked_bias")):
                continue
            if not name.startswith("transformer."):
                name = "transformer." + name
            if name == "transformer.wte.weight" and not self.shared_embedding:
                name = "lm_head.weight" if "lm_head.weight" in params else name
            if name.startswith(elsewhere):
                continue
            if name.endswith(_CONV1D):
                tensor = tensor.t()
            # The MLP's Conv1D layers sit on the block here (c_fc / c_proj without "mlp.").
            target = name.replace(".mlp.", ".")
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no matching model parameter")
            param = params[target]
            if ".attn.c_attn." in target:
                for shard_id, part in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                    param.weight_loader(param, part, shard_id)  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
            else:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(target)
        return loaded
