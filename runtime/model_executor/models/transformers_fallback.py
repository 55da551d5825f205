"""The transformers fallback (``--model-impl transformers``, or ``auto`` for an architecture with
no native implementation here): transformers' own modelling code, with this engine's paged KV
cache and attention kernels plugged in through transformers' attention interface.

The whole batch runs as one sequence of ``T`` tokens (``input_ids [1, T]``, ``position_ids
[1, T]``); transformers applies its embeddings, norms, rotary embeddings and MLPs, and each of its
attention modules calls ``paged_attention_forward`` below with its rotated queries, keys and
values, which goes to this engine's ``Attention`` for that layer: store into the paged cache,
attend per request as the step's metadata says. transformers builds no mask and keeps no cache.

It runs on one rank, eagerly (no torch.compile, no CUDA graphs). Sliding windows and attention
soft-capping are passed to the kernels; what the attention cannot honour (attention sinks) fails.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import transformers
from infernetes.runtime.model_executor import parallel
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.initialization import no_init_weights

logger = logging.getLogger(__name__)

ATTENTION_IMPLEMENTATION = "infernetes_paged"


class FallbackUnsupported(ValueError):
    """An architecture (or a feature of it) the transformers fallback cannot run."""


def paged_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query [1, H, T, D]``, ``key``/``value``
    ``[1, Hkv, T, D]`` -> ``([1, T, H, D], no weights)``."""
    attention: Attention = module.paged_attention  # type: ignore[assignment]  # bound by the fallback
    # transformers passes each layer's window and cap with the call (Mistral reads its config
    # there, Gemma its layer type); the layer's Attention takes them as given.
    attention.sliding_window = kwargs.get("sliding_window")
    attention.softcap = kwargs.get("softcap")
    if kwargs.get("s_aux") is not None:
        raise FallbackUnsupported("attention sinks (s_aux) are not supported")
    tokens = query.shape[2]
    q = query[0].transpose(0, 1).reshape(tokens, -1)
    k = key[0].transpose(0, 1).reshape(tokens, -1)
    v = value[0].transpose(0, 1).reshape(tokens, -1)
    out = attention(q, k, v)
    return out.view(1, tokens, attention.num_heads, attention.head_dim), None


transformers.AttentionInterface.register(ATTENTION_IMPLEMENTATION, paged_attention_forward)


def fallback_class(architecture: str) -> type[nn.Module]:
    """The transformers class of ``architecture`` if the fallback can run it, else a clear error."""
    cls = getattr(transformers, architecture, None)
    causal_lms = set(
        transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    )
    if cls is None or architecture not in causal_lms:
        raise FallbackUnsupported(
            f"{architecture} is not a causal language model that transformers "
            f"{transformers.__version__} can build"
        )
    if not getattr(cls, "_supports_attention_backend", False):
        raise FallbackUnsupported(
            f"transformers' {architecture} does not route its attention through transformers' "
            "attention interface, so the paged KV cache cannot be plugged into it"
        )
    return cls


def _check_supported(config: PretrainedConfig) -> None:
    if getattr(config, "is_encoder_decoder", False):
        raise FallbackUnsupported("encoder-decoder models are not supported")
    state = parallel.state()
    if state.tp_size > 1 or state.pp_size > 1:
        raise FallbackUnsupported(
            "the transformers fallback runs on one rank; tensor and pipeline parallelism need a "
            "native implementation (for the fallback they are planned)"
        )


class TransformersForCausalLM(nn.Module):
    """A transformers causal LM behind the engine's model interface."""

    eager_only = True  # transformers' Python control flow is not captured or compiled here

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        _check_supported(config)
        architecture = (config.architectures or ["?"])[0]
        fallback_class(architecture)
        config._attn_implementation = ATTENTION_IMPLEMENTATION
        with no_init_weights():  # every weight comes from the checkpoint
            self.hf = AutoModelForCausalLM.from_config(
                config,
                attn_implementation=ATTENTION_IMPLEMENTATION,
                dtype=torch.get_default_dtype(),
            )
        self.config = config
        self._bind_attention(config)
        logger.info(
            "%s runs through the transformers fallback (transformers' modelling code, this "
            "engine's paged attention); eagerly, on one rank",
            type(self.hf).__name__,
        )

    def _bind_attention(self, config: PretrainedConfig) -> None:
        """Give each of transformers' attention modules this engine's ``Attention``."""
        modules = [
            m
            for m in self.hf.modules()
            if type(m).__name__.endswith("Attention")
            and isinstance(getattr(m, "layer_idx", None), int)
        ]
        if len(modules) != config.num_hidden_layers:
            raise FallbackUnsupported(
                f"found {len(modules)} attention modules in {type(self.hf).__name__}, expected one "
                f"per layer ({config.num_hidden_layers})"
            )
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        for module in modules:
            head_dim = (
                getattr(module, "head_dim", None)
                or getattr(config, "head_dim", None)
                or config.hidden_size // heads
            )
            scale = getattr(module, "scaling", None) or head_dim**-0.5
            module.paged_attention = Attention(heads, head_dim, scale, kv_heads)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        out = self.hf.base_model(
            input_ids=input_ids[None], position_ids=positions[None], use_cache=False
        )
        return out.last_hidden_state[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        config = self.config
        logits = self.hf.get_output_embeddings()(hidden_states)
        # What transformers' causal-LM heads do to the logits after the projection.
        if getattr(config, "logits_scaling", None):  # Granite
            logits = logits / config.logits_scaling
        if getattr(config, "logit_scale", None):  # Cohere
            logits = logits * config.logit_scale
        if getattr(config, "final_logit_softcapping", None):  # Gemma 2 and 3
            cap = config.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.hf.named_parameters(remove_duplicate=False))  # tied: both names
        loaded: set[str] = set()
        for name, tensor in weights:
            if name not in params:
                if "rotary_emb." in name:  # buffers some checkpoints carry
                    continue
                raise ValueError(
                    f"checkpoint tensor {name!r} has no matching parameter in transformers' "
                    f"{type(self.hf).__name__}"
                )
            param = params[name]
            tensor = as_tensor(tensor)
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r} {tuple(tensor.shape)} does not fit "
                    f"{tuple(param.shape)}"
                )
            param.data.copy_(tensor)
            loaded.add(f"hf.{name}")
        if getattr(self.config, "tie_word_embeddings", False):
            self.hf.tie_weights()
        return loaded
