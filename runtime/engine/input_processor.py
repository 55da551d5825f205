"""InputProcessor: an API request becomes a prepared ``EngineCoreRequest``, or a ValueError naming
the problem.

It runs on the client side of the engine core's pipe (``AsyncEngine``, ``LLMEngine``), as vLLM V1's
processor runs in the API process, so that preparing a request (tokenizing, later preprocessing
images) never holds up the core's loop: it tokenizes a text prompt, runs a vision-language
model's processor over a prompt with images (``runtime/multimodal/``), checks a prompt given as
embeddings, checks the prompt and the sampling parameters against the model (vocabulary, context
length, ``--max-logprobs``) and fills in ``max_tokens`` and the stop tokens. What needs the core's
state (request ids in use, loading an adapter, compiling a structured-output constraint over the
core's tokenizer) and the ``n`` fan-out stay with the core (``EngineCore.add_request``). Nothing is queued when anything is wrong.

It imports no torch: the server's API process has none. A prompt given as embeddings is a tensor,
so whoever sends one has torch loaded already.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.engine.messages import EngineCoreRequest
from infernetes.runtime.logits_processor import load_logits_processor_classes, validate_request
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.multimodal.inputs import MultiModalPrompt
from infernetes.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    from infernetes.runtime.config import RuntimeConfig
    from infernetes.runtime.multimodal.audio import AudioProcessor
    from infernetes.runtime.multimodal.audio_language import AudioLanguageProcessor
    from infernetes.runtime.multimodal.processor import MultiModalProcessor

# Text, token ids, vLLM's EmbedsPrompt ({"prompt_embeds": tensor [num_prompt_tokens, hidden]}) or
# TextPrompt with images ({"prompt": text, "multi_modal_data": {"image": ...},
# "mm_processor_kwargs": {...}}), or such a prompt processed already (the server's, off its loop).
Prompt = str | Sequence[int] | Mapping[str, Any] | MultiModalPrompt


class InputSettings(NamedTuple):
    """What a request is checked against: facts of the resolved configuration, none of which
    changes while the engine runs (the core sends them to the API side in ``EngineInfo``)."""

    vocab_size: int
    max_model_len: int
    max_logprobs: int  # -1: no cap, as in vLLM
    is_pooling: bool
    scheduling_policy: str
    default_sampling_params: dict[str, Any]
    extra_eos_token_ids: frozenset[int]
    architecture: str
    hidden_size: int
    enable_prompt_embeds: bool  # --enable-prompt-embeds
    supports_prompt_embeds: bool  # the model takes input embeddings (models/interfaces.py)
    logits_processors: tuple[str, ...] = ()  # --logits-processors: each may refuse a request

    @classmethod
    def of(cls, config: RuntimeConfig, supports_prompt_embeds: bool) -> InputSettings:
        model = config.model
        return cls(
            vocab_size=model.vocab_size,
            max_model_len=model.max_model_len,
            max_logprobs=model.max_logprobs,
            is_pooling=model.is_pooling,
            scheduling_policy=config.scheduler.policy,
            default_sampling_params=dict(model.default_sampling_params),
            extra_eos_token_ids=model.extra_eos_token_ids,
            architecture=model.info.architecture,
            # read only for a model that takes embeddings (all of which have one)
            hidden_size=getattr(model.info.hf_config.get_text_config(), "hidden_size", 0),
            enable_prompt_embeds=model.enable_prompt_embeds,
            supports_prompt_embeds=supports_prompt_embeds,
            logits_processors=model.logits_processors,
        )


class InputProcessor:
    def __init__(
        self,
        settings: InputSettings,
        tokenizer: Any,
        mm_processor: MultiModalProcessor | AudioProcessor | AudioLanguageProcessor | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.mm_processor = mm_processor  # a vision-language model's
        self.logits_processor_classes = load_logits_processor_classes(settings.logits_processors)

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.settings.default_sampling_params)

    def process(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None,
        priority: int = 0,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> EngineCoreRequest:
        if self.settings.scheduling_policy != "priority" and priority != 0:
            raise ValueError("priority is only allowed with --scheduling-policy priority")
        embeds = digest = features = None
        if isinstance(prompt, Mapping) and "multi_modal_data" in prompt:
            prompt = self._multimodal(prompt)
        if isinstance(prompt, MultiModalPrompt):
            text, ids, features = prompt.prompt, prompt.prompt_token_ids, prompt.features
        elif isinstance(prompt, Mapping):
            embeds, digest = self._embeds(prompt)
            # No token ids are known: placeholders keep every count (blocks, positions) right.
            text, ids = None, [0] * len(embeds)
        else:
            text, ids = self._tokenize(prompt)
        if features is None and getattr(self.mm_processor, "requires_audio", False):
            raise RequestError(
                f"{self.settings.architecture} transcribes audio: a prompt needs "
                'multi_modal_data {"audio": (samples, sample_rate)} (or use '
                "/v1/audio/transcriptions)",
                "multi_modal_data.audio",
            )
        self._check_prompt(ids)
        if not self.settings.is_pooling:
            if params is None:
                params = self.default_sampling_params()
            if not isinstance(params, SamplingParams):
                raise TypeError(
                    f"sampling params must be a SamplingParams, got {type(params).__name__}"
                )
            params = self._check_params(params, len(ids))
            if embeds is not None and params.prompt_logprobs is not None:
                raise RequestError(
                    "prompt_logprobs needs the prompt's token ids; a prompt given as "
                    "prompt_embeds has none",
                    "prompt_logprobs",
                )
        else:
            params = None
        return EngineCoreRequest(
            request_id,
            text,
            ids,
            params,
            priority,
            lora_request,
            arrival_time,
            embeds,
            digest,
            features or None,
        )

    # -- prompt --------------------------------------------------------------------------------

    def _tokenize(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "a text prompt needs a tokenizer; the engine runs with --skip-tokenizer-init"
                )
            return prompt, list(self.tokenizer(prompt).input_ids)
        ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_token_ids must be a list of integers")
        return None, ids

    def process_multimodal(
        self,
        text: str,
        data: Mapping[str, Any],
        processor_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> MultiModalPrompt:
        """``text`` with its items' placeholders expanded by the model's processor, and the
        items preprocessed; RequestError naming the field when the model takes no such items."""
        if self.mm_processor is None:
            modalities = ", ".join(data) or "image"
            raise RequestError(
                f"{self.settings.architecture} takes text only: it cannot take {modalities} inputs",
                f"multi_modal_data.{next(iter(data), 'image')}",
            )
        if processor_kwargs is not None and not isinstance(processor_kwargs, Mapping):
            raise RequestError("mm_processor_kwargs must be an object", "mm_processor_kwargs")
        return self.mm_processor.process(text, data, processor_kwargs, add_special_tokens)

    def _multimodal(self, prompt: Mapping[str, Any]) -> MultiModalPrompt:
        data = prompt["multi_modal_data"]
        if not isinstance(data, Mapping):
            raise RequestError(
                'multi_modal_data must be a dict such as {"image": image}', "multi_modal_data"
            )
        if not isinstance(prompt.get("prompt"), str):
            raise RequestError(
                "multi_modal_data needs a text 'prompt' with a placeholder per item: the model's "
                "processor expands them",
                "prompt",
            )
        return self.process_multimodal(prompt["prompt"], data, prompt.get("mm_processor_kwargs"))

    def check_embeds_taken(self) -> None:
        """RequestError unless this engine takes prompts as embeddings."""
        settings = self.settings
        if not settings.enable_prompt_embeds:
            raise RequestError(
                "prompt_embeds needs the engine started with --enable-prompt-embeds",
                "prompt_embeds",
            )
        if not settings.supports_prompt_embeds:
            raise RequestError(
                f"prompt_embeds is not supported by {settings.architecture}: this model takes "
                "token ids only",
                "prompt_embeds",
            )

    def _embeds(self, prompt: Mapping[str, Any]) -> tuple[Any, bytes]:
        """The prompt's embeddings on the CPU, and the digest their prefix-cache blocks hash
        from: a prompt given as embeddings shares blocks only with the same embeddings, never
        with a token prompt whose placeholder ids it matches."""
        if "prompt_embeds" not in prompt:
            raise ValueError("a prompt dict needs 'prompt', 'prompt_token_ids' or 'prompt_embeds'")
        self.check_embeds_taken()
        settings = self.settings
        embeds = prompt["prompt_embeds"]
        shape = tuple(getattr(embeds, "shape", ()))
        if (
            len(shape) != 2
            or shape[1] != settings.hidden_size
            or not getattr(embeds, "is_floating_point", lambda: False)()
        ):
            raise RequestError(
                "prompt_embeds must be a floating-point tensor of shape [num_prompt_tokens, "
                f"{settings.hidden_size}], got {type(embeds).__name__} of shape {list(shape)}",
                "prompt_embeds",
            )
        import torch  # loaded already: the caller made the tensor

        embeds = embeds.detach().cpu().contiguous()
        digest = hashlib.sha256(f"{embeds.dtype}{shape}".encode())
        digest.update(embeds.view(-1).view(torch.uint8).numpy())
        return embeds, digest.digest()

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("The prompt cannot be empty.")
        vocab = self.settings.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"Token id {bad[0]} is out of vocabulary (the vocabulary size is {vocab})."
            )
        max_model_len = self.settings.max_model_len
        if len(ids) > max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {max_model_len}."
            )

    # -- sampling parameters -------------------------------------------------------------------

    def _check_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        cap = self.settings.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and 0 <= cap < value:
                raise RequestError(
                    f"Requested {name} of {value}, which is greater than the maximum allowed "
                    f"(--max-logprobs): {cap}.",
                    name,
                )
        vocab = self.settings.vocab_size
        for name, ids in (
            ("logit_bias", list(params.logit_bias or {})),
            ("allowed_token_ids", params.allowed_token_ids or []),
            ("stop_token_ids", params.stop_token_ids or []),
        ):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"{name} contains token id {bad[0]}, outside the vocabulary [0, {vocab})."
                )
        params = params.clone()
        self._settle_max_tokens(params, prompt_len)
        if (
            params.stop or params.logprobs is not None or params.detokenize
        ) and self.tokenizer is None:
            params.detokenize = False
            if params.stop:
                raise ValueError(
                    "stop strings need a tokenizer; the engine runs with --skip-tokenizer-init"
                )
        if not params.ignore_eos:
            params.all_stop_token_ids |= self.settings.extra_eos_token_ids
        try:
            validate_request(self.logits_processor_classes, params)
        except ValueError as error:
            raise RequestError(str(error), "vllm_xargs") from error
        return params

    def _settle_max_tokens(self, params: SamplingParams, prompt_len: int) -> None:
        max_model_len = self.settings.max_model_len
        if params.max_tokens is None:
            params.max_tokens = max_model_len - prompt_len
            if params.max_tokens < 1:
                raise ValueError(
                    f"The prompt (length {prompt_len}) leaves no room to generate within the "
                    f"maximum model length of {max_model_len}."
                )
        elif prompt_len + params.max_tokens > max_model_len:
            raise ValueError(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the prompt, "
                f"{params.max_tokens} in the completion). Please reduce the length of the prompt "
                "or max_tokens."
            )
