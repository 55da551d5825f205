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


def _deepseek() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.deepseek import DeepseekV2ForCausalLM

    return DeepseekV2ForCausalLM


def _deepseek_v3() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.deepseek import DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM


def _gemma() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.gemma import GemmaForCausalLM

    return GemmaForCausalLM


def _phi3() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llama import Phi3ForCausalLM

    return Phi3ForCausalLM


def _opt() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.opt import OPTForCausalLM

    return OPTForCausalLM


def _gpt2() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.gpt2 import GPT2LMHeadModel

    return GPT2LMHeadModel


def _llava() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llava import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration


def _llava_next() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llava_next import (
        LlavaNextForConditionalGeneration,
    )

    return LlavaNextForConditionalGeneration


def _llava_onevision() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llava_onevision import (
        LlavaOnevisionForConditionalGeneration,
    )

    return LlavaOnevisionForConditionalGeneration


def _gemma3_mm() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.gemma3_mm import Gemma3ForConditionalGeneration

    return Gemma3ForConditionalGeneration


def _qwen2_vl() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration

    return Qwen2VLForConditionalGeneration


def _qwen2_5_vl() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.qwen2_vl import (
        Qwen2_5_VLForConditionalGeneration,
    )

    return Qwen2_5_VLForConditionalGeneration


def _qwen3_vl() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration


def _qwen3_vl_moe() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.qwen3_vl import (
        Qwen3VLMoeForConditionalGeneration,
    )

    return Qwen3VLMoeForConditionalGeneration


def _mistral3() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.mistral3 import (
        Mistral3ForConditionalGeneration,
    )

    return Mistral3ForConditionalGeneration


def _qwen2_audio() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.qwen2_audio import (
        Qwen2AudioForConditionalGeneration,
    )

    return Qwen2AudioForConditionalGeneration


def _whisper() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.whisper import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration


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
    "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek_v3,
    "Phi3ForCausalLM": _phi3,
    "GemmaForCausalLM": _gemma,
    "Gemma2ForCausalLM": _gemma,
    "Gemma3ForCausalLM": _gemma,
    "Gemma3ForConditionalGeneration": _gemma3_mm,
    "OPTForCausalLM": _opt,
    "GPT2LMHeadModel": _gpt2,
    "LlavaForConditionalGeneration": _llava,
    "LlavaNextForConditionalGeneration": _llava_next,
    "LlavaOnevisionForConditionalGeneration": _llava_onevision,
    "Qwen2VLForConditionalGeneration": _qwen2_vl,
    "Qwen2_5_VLForConditionalGeneration": _qwen2_5_vl,
    "Qwen3VLForConditionalGeneration": _qwen3_vl,
    "Qwen3VLMoeForConditionalGeneration": _qwen3_vl_moe,
    "Mistral3ForConditionalGeneration": _mistral3,
    "Qwen2AudioForConditionalGeneration": _qwen2_audio,
    "WhisperForConditionalGeneration": _whisper,
}


def _bert_classifier() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.bert import BertForSequenceClassification

    return BertForSequenceClassification


def _xlm_roberta_classifier() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.roberta import (
        XLMRobertaForSequenceClassification,
    )

    return XLMRobertaForSequenceClassification


def _qwen3_classifier() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.qwen3_classifier import (
        Qwen3ForSequenceClassification,
    )

    return Qwen3ForSequenceClassification


POOLING = {
    "BertModel": _bert,
    "BertForSequenceClassification": _bert_classifier,
    "XLMRobertaForSequenceClassification": _xlm_roberta_classifier,
    "Qwen3ForSequenceClassification": _qwen3_classifier,
}
ARCHITECTURES = {**GENERATIVE, **POOLING}


def _eagle_llama() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llama_eagle import EagleLlamaForCausalLM

    return EagleLlamaForCausalLM


def _eagle3_llama() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    return Eagle3LlamaForCausalLM


def _deepseek_mtp() -> type[nn.Module]:
    from infernetes.runtime.model_executor.models.deepseek_mtp import DeepseekMTP

    return DeepseekMTP


# Speculative decoding heads: run only as --speculative-config's model, never served
DRAFT_HEADS = {
    "EagleLlamaForCausalLM": _eagle_llama,
    "Eagle3LlamaForCausalLM": _eagle3_llama,
    "DeepseekMTP": _deepseek_mtp,
}


MODEL_IMPLS = ("auto", "vllm", "transformers")


def model_class(architectures: list[str], impl: str = "auto") -> tuple[str, type[nn.Module]]:
    """The architecture to run and its class, by ``--model-impl``: ``vllm`` (this engine's own
    implementation), ``transformers`` (the transformers fallback) or ``auto`` (our own when we
    have it, else the fallback)."""
    if impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}; got {impl!r}")
    if impl != "transformers":
        for name in architectures:
            if name in ARCHITECTURES:
                return name, ARCHITECTURES[name]()
            if name in DRAFT_HEADS:
                return name, DRAFT_HEADS[name]()
    if impl == "vllm" or not architectures:
        raise ValueError(
            f"Model architectures {architectures} are not supported. "
            f"Supported architectures: {sorted(ARCHITECTURES)}"
            + (
                "; --model-impl auto or transformers may run it through transformers"
                if architectures
                else ""
            )
        )
    from infernetes.runtime.model_executor.models.transformers_fallback import (
        FallbackUnsupported,
        TransformersForCausalLM,
        fallback_class,
        is_image_text_to_text,
    )
    from infernetes.runtime.model_executor.models.transformers_fallback_mm import (
        TransformersForImageTextToText,
    )

    reasons = []
    for name in architectures:
        try:
            fallback_class(name)
        except FallbackUnsupported as error:
            reasons.append(str(error))
            continue
        if is_image_text_to_text(name):
            return name, TransformersForImageTextToText
        return name, TransformersForCausalLM
    raise ValueError(
        f"Model architectures {architectures} are not supported: this engine has no "
        f"implementation of them (it has {sorted(ARCHITECTURES)}) and the transformers fallback "
        f"cannot run them ({'; '.join(reasons)})"
    )
