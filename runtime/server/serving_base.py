"""What every OpenAI route shares: the model-name check, prompt tokenization and length checks,
request -> SamplingParams, the structured-output constraint, and engine-health checks."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.chat_parts import MediaPart, load_media, naming_the_part
from infernetes.runtime.multimodal.inputs import MultiModalPrompt
from infernetes.runtime.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.protocol import SamplingFields, StructuredOutputs
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.structured_output import GuideError, check_backend

if TYPE_CHECKING:
    from infernetes.runtime.engine.async_engine import AsyncEngine
    from infernetes.runtime.lora.request import LoRARequest
    from infernetes.runtime.server.chat_template import ChatRenderer
    from infernetes.runtime.server.lora_models import LoRAModels

logger = logging.getLogger("infernetes.runtime.server")


class ContextLengthError(APIError):
    """The prompt and the completion do not fit the model's context (vLLM's message)."""


def batch_items(raw: Any) -> list[Any]:
    """A prompt/input field as a list of items: one string, one token list, or a batch of them."""
    if isinstance(raw, str) or (raw and all(isinstance(x, int) for x in raw)):
        return [raw]
    return list(raw)


def guide_from_request(request: SamplingFields) -> StructuredOutputsParams | None:
    """The one structured-output constraint a request asks for, if any (checked by the engine)."""
    if request.structured_outputs is not None:
        return _structured_outputs_guide(request.structured_outputs)
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        return StructuredOutputsParams(
            "json", fmt.json_schema.json_schema, "response_format.json_schema.schema"
        )
    if fmt is not None and fmt.type == "json_object":
        return StructuredOutputsParams("json_object", None, "response_format")
    if request.guided_json is not None:
        return StructuredOutputsParams("json", request.guided_json, "guided_json")
    if request.guided_regex is not None:
        return StructuredOutputsParams("regex", request.guided_regex, "guided_regex")
    if request.guided_choice is not None:
        return StructuredOutputsParams("choice", request.guided_choice, "guided_choice")
    if request.guided_grammar is not None:
        return StructuredOutputsParams("grammar", request.guided_grammar, "guided_grammar")
    return None


def _structured_outputs_guide(fields: StructuredOutputs) -> StructuredOutputsParams:
    (kind,) = fields.constraints  # the request model allows exactly one
    param = f"structured_outputs.{kind}"
    if kind == "structural_tag":
        raise APIError(
            "structured_outputs.structural_tag is not supported by the guidance backend here; "
            "use json, regex, choice, grammar or json_object",
            400,
            param,
        )
    if fields.disable_additional_properties:
        raise APIError(
            "structured_outputs.disable_additional_properties is not supported by the guidance "
            "backend here yet",
            400,
            "structured_outputs.disable_additional_properties",
        )
    spec = {
        "json": fields.json_schema,
        "regex": fields.regex,
        "choice": fields.choice,
        "grammar": fields.grammar,
        "json_object": None,
    }[kind]
    return StructuredOutputsParams(kind, spec, param, compact=fields.disable_any_whitespace or None)


class ServingBase:
    loras: LoRAModels | None = None  # the server's adapters (ServerState.attach_engine sets it)

    def __init__(self, engine: AsyncEngine, settings: FrontendSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.max_model_len
        model_config = getattr(engine, "model_config", None)
        self.vocab_size: int = int(getattr(model_config, "vocab_size", None) or len(self.tokenizer))

    # ------------------------------------------------------------ checks

    def check_model(self, name: str | None) -> LoRARequest | None:
        """The adapter ``name`` selects (None: the base model); 404 for a name not served."""
        if name is None or name in self.settings.served_model_names:
            return None
        lora = self.loras.resolve(name) if self.loras is not None else None
        if lora is not None:
            return lora
        served = [*self.settings.served_model_names]
        if self.loras is not None:
            served += self.loras.adapters
        raise APIError(
            f"The model `{name}` does not exist. Served models: {', '.join(served)}",
            404,
            "model",
        )

    def check_engine(self) -> None:
        if getattr(self.engine, "errored", False):
            raise APIError(
                f"the engine has stopped: {getattr(self.engine, 'dead_error', None)}", 503
            )
        if getattr(self.engine, "is_sleeping", False):
            raise APIError("the engine is sleeping; POST /wake_up first", 503)

    # ------------------------------------------------------------ prompts

    def with_media(
        self,
        text: str,
        media: list[MediaPart],
        add_special_tokens: bool,
        processor_kwargs: dict[str, Any] | None = None,
    ) -> MultiModalPrompt:
        """A rendered chat's text and its image, video and audio parts, read and run through the
        model's processor (in the preparation threads); every fault a 400 naming its field (an
        item's: its part)."""
        if processor_kwargs and not self.settings.trust_request_mm_kwargs:
            raise APIError(
                "mm_processor_kwargs in a request is refused unless the server is started with "
                "--trust-request-mm-kwargs",
                400,
                "mm_processor_kwargs",
            )
        try:
            return self.engine.input_processor.process_multimodal(
                text, load_media(media, self.settings.media), processor_kwargs, add_special_tokens
            )
        except RequestError as error:
            error = naming_the_part(error, media)
            raise APIError(str(error), 400, error.param) from error

    def chat_prompt(
        self,
        renderer: ChatRenderer,
        messages: list[Any],
        *,
        add_special_tokens: bool,
        template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        processor_kwargs: dict[str, Any] | None = None,
        truncate: int | None = None,
    ) -> list[int] | MultiModalPrompt:
        """A chat's prompt as the model sees it: the tokenizer's own chat encoding where it has
        one, else the rendered template tokenized, with each media part's feature tokens. Chat
        completions and /tokenize both call this, so /tokenize counts what chat would send."""
        encoded = renderer.encode_chat(
            messages,
            template=template,
            tools=tools,
            continue_final_message=continue_final_message,
        )
        if encoded is not None:
            return encoded[-truncate:] if truncate else encoded
        media: list[MediaPart] = []
        text = renderer.render(
            messages,
            media=media,
            template=template,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_kwargs=template_kwargs,
        )
        if not media:
            return self.tokenize(text, add_special_tokens, truncate)
        if truncate:
            raise APIError(
                "truncate_prompt_tokens cannot cut a prompt with images or videos",
                400,
                "truncate_prompt_tokens",
            )
        return self.with_media(text, media, add_special_tokens, processor_kwargs)

    def tokenize(
        self, text: str, add_special_tokens: bool, truncate: int | None = None
    ) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return ids[-truncate:] if truncate else ids

    def check_token_ids(self, ids: list[int], param: str) -> list[int]:
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(
                f"{param}: token ids must be in [0, {self.vocab_size}), got {bad[:5]}", 400, param
            )
        return ids

    def resolve_max_tokens(self, prompt_len: int, requested: int | None, what: str) -> int:
        """vLLM's context-length rule and message: prompt + max_tokens must fit the model."""
        if prompt_len >= self.max_model_len or (
            requested is not None and prompt_len + requested > self.max_model_len
        ):
            asked = prompt_len + (requested or 0)
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {asked} tokens ({prompt_len} in the {what}, {requested or 0} in "
                f"the completion). Please reduce the length of the {what} or completion.",
                400,
                "max_tokens" if requested else "messages" if what == "messages" else "prompt",
            )
        tokens = requested if requested is not None else self.max_model_len - prompt_len
        # The generation config's max_new_tokens is vLLM's default and cap alike.
        cap = self._default_sampling().get("max_tokens")
        return min(tokens, cap) if isinstance(cap, int) and cap > 0 else tokens

    # ------------------------------------------------------------ sampling

    def sampling_params(
        self,
        request: SamplingFields,
        *,
        max_tokens: int,
        logprobs: int | None,
        stream: bool,
        guide: StructuredOutputsParams | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        fields: dict[str, Any] = {
            "n": request.n,
            "presence_penalty": request.presence_penalty or 0.0,
            "frequency_penalty": request.frequency_penalty or 0.0,
            "seed": request.seed,
            "stop": request.stop,
            "stop_token_ids": request.stop_token_ids,
            "ignore_eos": request.ignore_eos,
            "max_tokens": max_tokens,
            "min_tokens": request.min_tokens,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs
            if prompt_logprobs is not None
            else request.prompt_logprobs,
            "skip_special_tokens": request.skip_special_tokens,
            "spaces_between_special_tokens": request.spaces_between_special_tokens,
            "include_stop_str_in_output": request.include_stop_str_in_output,
            "output_kind": RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
            "extra_args": dict(request.vllm_xargs) if request.vllm_xargs else None,
        }
        defaults = self._default_sampling()
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            value = getattr(request, name)
            if value is None:
                value = defaults.get(name)
            if value is not None:
                fields[name] = value
        if request.logit_bias:
            try:
                fields["logit_bias"] = {int(k): float(v) for k, v in request.logit_bias.items()}
            except ValueError as exc:
                raise APIError(
                    f"logit_bias keys must be token ids: {exc}", 400, "logit_bias"
                ) from exc
            self.check_token_ids(list(fields["logit_bias"]), "logit_bias")
        if guide is not None:
            fields["structured_outputs"] = self.structured_outputs(guide, request)
        if request.kv_transfer_params is not None:
            if request.n != 1:
                raise APIError(
                    "kv_transfer_params: a disaggregated prefill serves n 1 only",
                    400,
                    "kv_transfer_params",
                )
            fields["extra_args"] = {
                **(fields["extra_args"] or {}),
                "kv_transfer_params": request.kv_transfer_params,
            }
        try:
            return SamplingParams(**fields)
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), 400) from exc

    def _default_sampling(self) -> dict[str, Any]:
        """Sampling defaults of the model's generation config, when the engine exposes them."""
        getter = getattr(self.engine, "default_sampling_params", None)
        defaults = getter() if callable(getter) else getter
        if isinstance(defaults, SamplingParams):
            return {
                k: getattr(defaults, k)
                for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
            }
        return dict(defaults or {})

    def structured_outputs(
        self, guide: StructuredOutputsParams, request: SamplingFields
    ) -> StructuredOutputsParams:
        """``guide`` with the server's whitespace default where the request gave none, once the
        backends are known to be ours (the engine core compiles and checks the constraint)."""
        try:
            check_backend(self.settings.guided_decoding_backend, "--guided-decoding-backend")
            check_backend(
                request.guided_decoding_backend,
                server_backend=self.settings.guided_decoding_backend,
            )
        except GuideError as exc:
            raise APIError(str(exc), 400, exc.param) from exc
        if guide.compact is not None:
            return guide
        return dataclasses.replace(
            guide, compact=self.settings.guided_decoding_disable_any_whitespace
        )

    def stream_usage(self, options: Any) -> tuple[bool, bool]:
        """(usage chunk at the end, usage on every chunk) of a stream: as the request's
        stream_options ask, or the final chunk always with --enable-force-include-usage."""
        forced = self.settings.enable_force_include_usage
        if options is None:
            return forced, False
        include = bool(options.include_usage) or forced
        return include, include and bool(options.continuous_usage_stats)

    # ------------------------------------------------------------ logging

    def log_request(
        self, request_id: str, prompt: str | None, token_ids: list[int], params: Any
    ) -> None:
        """vLLM's request log (--enable-log-requests): the id and parameters at INFO; the prompt
        and its token ids, each cut to --max-log-len, at DEBUG."""
        if not self.settings.enable_log_requests:
            return
        if logger.isEnabledFor(logging.DEBUG):
            limit = self.settings.max_log_len
            logger.debug(
                "Request %s details: prompt: %r, prompt_token_ids: %s",
                request_id,
                prompt if limit is None or prompt is None else prompt[:limit],
                token_ids if limit is None else token_ids[:limit],
            )
        logger.info("Received request %s: params: %s", request_id, params)
