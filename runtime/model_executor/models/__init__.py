"""The architectures infernetes implements, by the name in a config.json's ``architectures``."""

from __future__ import annotations

from torch import nn


def _llama() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llama import LlamaForCausalLM

    return LlamaForCausalLM


def _qwen_moe() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.moe import Qwen2MoeForCausalLM

    return Qwen2MoeForCausalLM


def _mixtral() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.moe import MixtralForCausalLM

    return MixtralForCausalLM


def _opt() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.opt import OPTForCausalLM

    return OPTForCausalLM


def _gpt2() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.gpt2 import GPT2LMHeadModel

    return GPT2LMHeadModel


def _bert() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.bert import BertModel

    return BertModel


GENERATIVE = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _llama,
    "Qwen2ForCausalLM": _llama,
    "Qwen3ForCausalLM": _llama,
    "Qwen2MoeForCausalLM": _qwen_moe,
    "Qwen3MoeForCausalLM": _qwen_moe,
    "MixtralForCausalLM": _mixtral,
    "OPTForCausalLM": _opt,
    "GPT2LMHeadModel": _gpt2,
}


def _bert_classifier() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.bert import BertForSequenceClassification

    return BertForSequenceClassification


POOLING = {"BertModel": _bert, "BertForSequenceClassification": _bert_classifier}
ARCHITECTURES = {**GENERATIVE, **POOLING}


def model_class(architectures: list[str]) -> tuple[str, type[nn.Module]]:
    """The first supported architecture of ``architectures`` and its class."""
    for name in architectures:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]()
    raise ValueError(
        f"Model architectures {architectures} are not supported. "
        f"Supported architectures: {sorted(ARCHITECTURES)}"
    )
