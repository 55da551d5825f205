"""--speculative-config read into a ``SpeculativeConfig`` as vLLM's checks it, for the methods
built here (n-gram prompt lookup, a draft model). Called before serve starts
(``runtime/preflight.py``) and when the engine resolves its configuration, which then resolves the
draft checkpoint against the target (``with_draft_model``)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from infernetes.runtime.config import SpeculativeConfig
from infernetes.runtime.model_executor.loader import (
    ModelInfo,
    inspect_model,
    load_hf_config,
    resolve_model_path,
)

from infernetes.schema.errors import check_json_keys

_SPECULATIVE_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "draft_tensor_parallel_size",
    "max_model_len",
    "disable_by_batch_size",
)
_NGRAM_NAMES = ("ngram", "[ngram]")
_PLANNED_METHODS = ("medusa", "mlp_speculator", "suffix")
_BUILT_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
EAGLE_METHODS = ("eagle", "eagle3")
# heads whose position p reads the token at p + 1 with the hidden state at p
HIDDEN_STATE_METHODS = (*EAGLE_METHODS, "mtp")
# vLLM's default when neither bound is given ("arbitrarily chosen", its comment says)
_PROMPT_LOOKUP_DEFAULT = 5


def speculative_config(
    given: dict[str, Any] | None,
    pipeline_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
) -> SpeculativeConfig | None:
    """--speculative-config's keys checked as vLLM's SpeculativeConfig checks them, for n-gram
    prompt lookup and draft models. As in vLLM, ``model`` "ngram" or "[ngram]" (the deprecated
    --speculative-model) names the method, any other ``model`` without a method is a draft model,
    and a missing lookup bound takes the other's value (both missing: 5)."""
    if not given:
        return None
    check_json_keys("speculative_config", given, _SPECULATIVE_KEYS)
    method = _method(given)
    k = _positive_int("num_speculative_tokens", given.get("num_speculative_tokens"))
    if pipeline_parallel_size > 1:
        raise ValueError(
            "--speculative-config cannot be combined with --pipeline-parallel-size above 1 yet: "
            "the stages before the last learn each step's sampled tokens from the scheduler, "
            "not its drafts nor how many the last stage kept; speculative decoding across "
            "pipeline stages is planned"
        )
    spec = (
        _ngram(given, k)
        if method == "ngram"
        else _draft_model(given, method, k, tensor_parallel_size)
    )
    disable = given.get("disable_by_batch_size")
    if disable is None:
        return spec
    return dataclasses.replace(
        spec, disable_by_batch_size=_positive_int("disable_by_batch_size", disable)
    )


def _method(given: dict[str, Any]) -> str:
    method, model = given.get("method"), given.get("model")
    if method is None and model in _NGRAM_NAMES:
        return "ngram"
    if method is None and isinstance(model, str):  # vLLM's inference from the checkpoint's name
        name = model.lower()
        method = "eagle3" if "eagle3" in name else "eagle" if "eagle" in name else "draft_model"
    if method in _PLANNED_METHODS:
        raise ValueError(
            f"speculative_config.method {method!r} is not built yet (planned); the methods built "
            'are "ngram", "draft_model", "eagle", "eagle3" and "mtp"'
        )
    if method not in _BUILT_METHODS:
        raise ValueError(
            'speculative_config.method must be "ngram" (n-gram prompt lookup), "draft_model" '
            '(a smaller model with the target\'s vocabulary, named by model), "eagle" or "eagle3" '
            '(an EAGLE-1 or EAGLE-3 head for a Llama target, named by model) or "mtp" (a '
            f"DeepSeek target's own multi-token-prediction layer); got {method!r}"
        )
    return method


def _ngram(given: dict[str, Any], k: int) -> SpeculativeConfig:
    for key in ("draft_tensor_parallel_size", "max_model_len"):
        if key in given:
            raise ValueError(
                f"speculative_config.{key} is for a draft model; method ngram has none"
            )
    low, high = given.get("prompt_lookup_min"), given.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = _PROMPT_LOOKUP_DEFAULT
    low = _positive_int("prompt_lookup_min", high if low is None else low)
    high = _positive_int("prompt_lookup_max", low if high is None else high)
    if low > high:
        raise ValueError(
            f"speculative_config.prompt_lookup_min={low} must be <= prompt_lookup_max={high}"
        )
    return SpeculativeConfig("ngram", k, low, high)


def _draft_model(
    given: dict[str, Any], method: str, k: int, tensor_parallel_size: int
) -> SpeculativeConfig:
    model = given.get("model")
    if method == "mtp" and model is None:
        model = ""  # the target's own checkpoint (with_draft_model)
    elif not isinstance(model, str) or not model:
        raise ValueError(
            "speculative_config.model must name the draft checkpoint (a folder or hub id) for "
            f"method {method}; got {model!r}"
        )
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if key in given:
            raise ValueError(f"speculative_config.{key} is for method ngram, not {method}")
    draft_tp = given.get("draft_tensor_parallel_size", tensor_parallel_size)
    if draft_tp != tensor_parallel_size:
        allowed = "1 or the target's" if tensor_parallel_size == 1 else "the target's"
        planned = (
            " (a draft on one rank under a sharded target is planned)" if draft_tp == 1 else ""
        )
        raise ValueError(
            f"speculative_config.draft_tensor_parallel_size must be {allowed} "
            f"--tensor-parallel-size ({tensor_parallel_size}); got {draft_tp!r}{planned}"
        )
    max_len = given.get("max_model_len")
    if max_len is not None:
        max_len = _positive_int("max_model_len", max_len)
    return SpeculativeConfig(method, k, draft_model=model, draft_max_model_len=max_len)


def with_draft_model(
    spec: SpeculativeConfig | None,
    target: ModelInfo,
    device: torch.device,
    download_dir: str | None = None,
    hf_token: str | None = None,
    ignore_patterns: Sequence[str] | None = None,
) -> SpeculativeConfig | None:
    """``spec`` with its draft checkpoint read and checked against the target: the same
    vocabulary, the target's dtype, and a context no longer than the target's (by default the
    shorter of the two models')."""
    if spec is None or spec.draft_model is None:
        return spec
    if spec.method == "mtp":
        return dataclasses.replace(spec, draft=_mtp_layer(spec, target))
    path = resolve_model_path(
        spec.draft_model, None, download_dir, hf_token, ignore_patterns=ignore_patterns
    )
    hf_config = load_hf_config(path, trust_remote_code=False)
    if spec.method in EAGLE_METHODS:
        _check_eagle_head(spec.method, spec.draft_model, hf_config, target)
    if spec.draft_max_model_len is not None and spec.draft_max_model_len > target.max_model_len:
        raise ValueError(
            f"speculative_config.max_model_len={spec.draft_max_model_len} must not exceed the "
            f"target's max_model_len of {target.max_model_len}"
        )
    dtype = str(target.dtype).removeprefix("torch.")
    draft = inspect_model(path, hf_config, dtype, spec.draft_max_model_len, device)
    if draft.is_pooling:
        raise ValueError(
            f"speculative_config.model {spec.draft_model!r} is a pooling model; a draft must "
            "generate"
        )
    draft_vocab = draft.hf_config.get_text_config().vocab_size
    target_vocab = target.hf_config.get_text_config().vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"speculative_config.model {spec.draft_model!r} has a vocabulary of {draft_vocab} "
            f"tokens and the target one of {target_vocab}: a draft model must share the "
            "target's tokenizer and vocabulary"
        )
    max_len = min(draft.max_model_len, target.max_model_len)
    return dataclasses.replace(spec, draft=dataclasses.replace(draft, max_model_len=max_len))


def _mtp_layer(spec: SpeculativeConfig, target: ModelInfo) -> ModelInfo:
    """The target's multi-token-prediction layer as a head: a DeepSeek checkpoint's layer after
    its decoder layers, read from the target's own files."""
    if spec.draft_model not in ("", str(target.path)):
        raise ValueError(
            "speculative_config.model for method mtp must be the target itself (or left out): "
            f"its MTP layers are in the target's checkpoint; got {spec.draft_model!r}"
        )
    layers = getattr(target.hf_config, "num_nextn_predict_layers", 0) or 0
    if target.architecture not in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM") or not layers:
        raise ValueError(
            "speculative_config.method mtp runs a DeepSeek checkpoint's multi-token-prediction "
            f"layers (num_nextn_predict_layers); {target.architecture} with "
            f"num_nextn_predict_layers={layers} has none (MTP of other families is planned)"
        )
    hf_config = copy.deepcopy(target.hf_config)
    hf_config.architectures = ["DeepseekMTP"]
    return dataclasses.replace(target, hf_config=hf_config, architecture="DeepseekMTP")


def _check_eagle_head(method: str, name: str, head: Any, target: ModelInfo) -> None:
    """An EAGLE head runs on a Llama-family target's hidden states, of the same width (EAGLE-3:
    of layers the target has); it is read as vLLM reads one, whatever architecture its
    config.json names."""
    from infernetes.runtime.model_executor.loader import model_class_of
    from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM

    if not issubclass(model_class_of(target), LlamaForCausalLM):
        raise ValueError(
            f"speculative_config.method {method} runs EAGLE heads for Llama-family targets; "
            f"{target.architecture} is not one (EAGLE for other families is planned)"
        )
    text = target.hf_config.get_text_config()
    width = head.hidden_size
    if method == "eagle3":
        width = getattr(head, "target_hidden_size", None) or width
        _check_aux_layers(name, head, text.num_hidden_layers)
    target_width = text.hidden_size
    if width != target_width:
        raise ValueError(
            f"speculative_config.model {name!r} has hidden_size {width} and the target "
            f"{target_width}: an EAGLE head reads the target's hidden states"
        )
    head.architectures = [
        "Eagle3LlamaForCausalLM" if method == "eagle3" else "EagleLlamaForCausalLM"
    ]


def _check_aux_layers(name: str, head: Any, num_layers: int) -> None:
    from infernetes.runtime.model_executor.models.llama_eagle3 import aux_layer_ids

    layers = aux_layer_ids(head, num_layers)
    if len(layers) != 3 or not all(0 <= i < num_layers for i in layers):
        raise ValueError(
            f"speculative_config.model {name!r} reads the target's hidden states at layers "
            f"{list(layers)}, which a target of {num_layers} layers does not have (three are "
            "needed)"
        )


def lookahead_tokens(spec: SpeculativeConfig | None) -> int:
    """The slots a step holds past its tokens for the draft model's guesses: its keys and values
    at the positions of the drafts after the first (one spare)."""
    return spec.num_speculative_tokens if spec is not None and spec.draft is not None else 0


def _positive_int(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config.{key} must be an integer of 1 or more; got {value!r}")
    return value
