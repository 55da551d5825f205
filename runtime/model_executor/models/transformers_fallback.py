"""The transformers fallback (``--model-impl transformers``, or ``auto`` for an architecture with
no native implementation here): transformers' own modelling code, with this engine's paged KV
cache and attention kernels plugged in through transformers' attention interface.

The whole batch runs as one sequence of ``T`` tokens (``input_ids [1, T]``, ``position_ids
[1, T]``); transformers applies its embeddings, norms, rotary embeddings and MLPs, and each of its
attention modules calls ``paged_attention_forward`` below with its rotated queries, keys and
values, which goes to this engine's ``Attention`` for that layer: store into the paged cache,
attend per request as the step's metadata says. transformers builds no mask and keeps no cache.

It runs eagerly (no torch.compile, no CUDA graphs), as one pipeline stage; under tensor
parallelism the linear layers transformers' ``base_model_tp_plan`` splits are swapped for this
engine's parallel layers. Each layer's sliding window, soft-cap and attention sinks come with
transformers' call and go to the kernels.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterable

import torch
import transformers
from infernetes.runtime.model_executor import parallel
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.mxfp4 import dequantize_mxfp4
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

logger = logging.getLogger(__name__)

ATTENTION_IMPLEMENTATION = "infernetes_paged"
LOGIT_SCALINGS = frozenset(("logits_scaling", "logit_scale", "final_logit_softcapping"))


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
    sinks = kwargs.get("s_aux")  # gpt-oss's per-head sink logits, for all heads
    if sinks is not None and sinks.numel() != attention.num_heads:  # this rank's heads
        sinks = sinks.narrow(0, parallel.tp_rank() * attention.num_heads, attention.num_heads)
    attention.sinks = sinks
    tokens = query.shape[2]
    q = query[0].transpose(0, 1).reshape(tokens, -1)
    k = key[0].transpose(0, 1).reshape(tokens, -1)
    v = value[0].transpose(0, 1).reshape(tokens, -1)
    out = attention(q, k, v)
    return out.view(1, tokens, attention.num_heads, attention.head_dim), None


transformers.AttentionInterface.register(ATTENTION_IMPLEMENTATION, paged_attention_forward)


def is_image_text_to_text(architecture: str) -> bool:
    """Whether transformers builds ``architecture`` as an image-text-to-text model (a vision
    tower and a language model; ``AutoModelForImageTextToText``), not a causal LM."""
    mapping = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    # Fuyu's and GIT's causal LMs read images in their own forward, not as a tower beside a
    # language model; Gemma 3's composite class is in both mappings, and is one
    return architecture in set(mapping.values()) and not architecture.endswith("ForCausalLM")


def check_image_text_to_text(cls: type[nn.Module], architecture: str) -> None:
    """FallbackUnsupported when transformers' ``cls`` (an image-text-to-text model) does not
    fit this path."""
    forward = inspect.signature(cls.forward).parameters
    if "mm_token_type_ids" in forward or hasattr(cls, "get_rope_index"):
        raise FallbackUnsupported(
            f"transformers' {architecture} places image tokens with M-RoPE (position ids from "
            "the whole prompt's image grids), which this fallback does not derive; it needs a "
            "native implementation"
        )
    if "token_type_ids" in forward:
        raise FallbackUnsupported(
            f"transformers' {architecture} attends bidirectionally within images or its prefix "
            "(token_type_ids), which the fallback's causal paged attention does not do; it needs "
            "a native implementation"
        )
    if not hasattr(cls, "get_image_features"):
        raise FallbackUnsupported(
            f"transformers' {architecture} has no get_image_features to encode images with"
        )


def fallback_class(architecture: str) -> type[nn.Module]:
    """The transformers class of ``architecture`` if the fallback can run it, else a clear error."""
    cls = getattr(transformers, architecture, None)
    causal_lms = set(
        transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    )
    if cls is None or not (architecture in causal_lms or is_image_text_to_text(architecture)):
        raise FallbackUnsupported(
            f"{architecture} is neither a causal language model nor an image-text-to-text "
            f"model that transformers {transformers.__version__} can build"
        )
    if not getattr(cls, "_supports_attention_backend", False):
        raise FallbackUnsupported(
            f"transformers' {architecture} does not route its attention through transformers' "
            "attention interface, so the paged KV cache cannot be plugged into it"
        )
    if is_image_text_to_text(architecture):
        check_image_text_to_text(cls, architecture)
    return cls


def _check_supported(config: PretrainedConfig) -> None:
    if getattr(config, "is_encoder_decoder", False):
        raise FallbackUnsupported("encoder-decoder models are not supported")
    if parallel.state().pp_size > 1:
        raise FallbackUnsupported(
            "the transformers fallback runs as one pipeline stage; pipeline parallelism needs a "
            "native implementation (for the fallback it is planned)"
        )


def _plan_pattern(key: str) -> re.Pattern[str]:
    # "layers.*.self_attn.q_proj": the star stands for a layer number
    return re.compile(re.escape(key).replace(r"\*", r"\d+") + "$")


def shard_linear_layers(model: nn.Module, plan: dict[str, str]) -> int:
    """Under tensor parallelism, swap the ``nn.Linear`` layers that transformers'
    ``base_model_tp_plan`` splits plainly (``colwise``, ``rowwise``) for this engine's parallel
    layers (same parameter names; each rank loads its slice). Other styles (a norm over the whole
    projection, gathered outputs) stay replicated: correct, only not split. Returns how many."""
    patterns = [(_plan_pattern(key), style) for key, style in plan.items()]
    swapped = 0
    for name, module in list(model.named_modules()):
        style = next((style for pattern, style in patterns if pattern.match(name)), None)
        if style not in ("colwise", "rowwise") or type(module) is not nn.Linear:
            continue
        parallel_class = ColumnParallelLinear if style == "colwise" else RowParallelLinear
        layer = parallel_class(module.in_features, module.out_features, module.bias is not None)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, layer)
        swapped += 1
    return swapped


def dequantized_mxfp4(
    weights: Iterable[tuple[str, torch.Tensor]], params: dict[str, nn.Parameter]
) -> Iterable[tuple[str, torch.Tensor]]:
    """gpt-oss's MXFP4 experts (``<name>_blocks`` and ``<name>_scales``, ``[E, out, G, 16]``
    and ``[E, out, G]``) as the ``<name>`` ``[E, in, out]`` transformers' experts hold; every
    other tensor as it comes."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        base, _, part = name.rpartition("_")
        if part not in ("blocks", "scales") or base not in params:
            yield name, tensor
            continue
        pending.setdefault(base, {})[part] = as_tensor(tensor)
        if len(pending[base]) == 2:
            parts = pending.pop(base)
            dense = dequantize_mxfp4(parts["blocks"], parts["scales"], params[base].dtype)
            yield base, dense.transpose(-1, -2)
    if pending:
        raise ValueError(f"MXFP4 tensors without their other half: {sorted(pending)}")


class TransformersForCausalLM(nn.Module):
    """A transformers causal LM behind the engine's model interface."""

    eager_only = True  # transformers' Python control flow is not captured or compiled here
    is_transformers_fallback = True
    # the scalings of the logits (names in the text config) that transformers' head applies
    logit_scalings: frozenset[str] = LOGIT_SCALINGS

    def __init__(self, config: PretrainedConfig, max_position: int) -> None:
        super().__init__()
        _check_supported(config)
        architecture = (config.architectures or ["?"])[0]
        fallback_class(architecture)
        with no_init_weights():  # every weight comes from the checkpoint
            self.hf: PreTrainedModel = self._build(config)
        self.config = config
        self.text_config = config.get_text_config()
        if parallel.tp_size() > 1:
            plan = getattr(config, "base_model_tp_plan", None) or {}
            if not shard_linear_layers(self.hf.base_model, plan):
                raise FallbackUnsupported(
                    f"transformers' {architecture} has no tensor-parallel plan this engine can "
                    "apply (base_model_tp_plan with colwise/rowwise layers)"
                )
        self._bind_attention(self.text_config)
        logger.info(
            "%s runs through the transformers fallback (transformers' modelling code, this "
            "engine's paged attention), eagerly",
            type(self.hf).__name__,
        )

    def _build(self, config: PretrainedConfig) -> PreTrainedModel:
        """transformers' model of ``config``, its attention through ``paged_attention_forward``."""
        config._attn_implementation = ATTENTION_IMPLEMENTATION
        return AutoModelForCausalLM.from_config(
            config, attn_implementation=ATTENTION_IMPLEMENTATION, dtype=torch.get_default_dtype()
        )

    @property
    def language_model(self) -> nn.Module:
        """transformers' decoder stack: ids or embeddings and positions in, hidden states out."""
        return self.hf.base_model

    def _bind_attention(self, config: PretrainedConfig) -> None:
        """Give each of transformers' attention modules this engine's ``Attention``."""
        modules = [
            m
            for m in self.language_model.modules()
            if type(m).__name__.endswith("Attention")
            and isinstance(getattr(m, "layer_idx", None), int)
        ]
        if len(modules) != config.num_hidden_layers:
            raise FallbackUnsupported(
                f"found {len(modules)} attention modules in {type(self.hf).__name__}, expected one "
                f"per layer ({config.num_hidden_layers})"
            )
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        tp = parallel.tp_size()
        for module in modules:
            # A layer whose projections were split holds its share of the heads.
            split = any(isinstance(child, ColumnParallelLinear) for child in module.children())
            if split and (total_heads % tp or total_kv_heads % tp):
                raise FallbackUnsupported(
                    f"{total_heads} attention heads and {total_kv_heads} key/value heads do not "
                    f"divide by the tensor-parallel size {tp} (the fallback does not replicate "
                    "key/value heads)"
                )
            heads = total_heads // tp if split else total_heads
            kv_heads = total_kv_heads // tp if split else total_kv_heads
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
        out = self.language_model(
            input_ids=input_ids[None], position_ids=positions[None], use_cache=False
        )
        return out.last_hidden_state[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        config = self.text_config
        logits = self.hf.get_output_embeddings()(hidden_states)
        # What transformers' causal-LM heads do to the logits after the projection.
        scalings = self.logit_scalings
        if "logits_scaling" in scalings and getattr(config, "logits_scaling", None):  # Granite
            logits = logits / config.logits_scaling
        if "logit_scale" in scalings and getattr(config, "logit_scale", None):  # Cohere
            logits = logits * config.logit_scale
        if "final_logit_softcapping" in scalings and getattr(  # Gemma 2 and 3
            config, "final_logit_softcapping", None
        ):
            cap = config.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def checkpoint_names(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors by the names of transformers' parameters."""
        return weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.hf.named_parameters(remove_duplicate=False))  # tied: both names
        loaded: set[str] = set()
        for name, tensor in dequantized_mxfp4(self.checkpoint_names(weights), params):
            if name not in params:
                if "rotary_emb." in name:  # buffers some checkpoints carry
                    continue
                raise ValueError(
                    f"checkpoint tensor {name!r} has no matching parameter in transformers' "
                    f"{type(self.hf).__name__}"
                )
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is not None:  # a parallel layer's: it takes this rank's slice
                loader(param, tensor)
                loaded.add(f"hf.{name}")
                continue
            tensor = as_tensor(tensor)
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r} {tuple(tensor.shape)} does not fit "
                    f"{tuple(param.shape)}"
                )
            param.data.copy_(tensor)
            loaded.add(f"hf.{name}")
        if getattr(self.config, "tie_word_embeddings", False):  # transformers ties by the top one
            self.hf.tie_weights()
        return loaded
