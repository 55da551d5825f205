"""LLM: the offline API, like vLLM's (``LLM(model=..., **engine_args).generate(prompts, params)``)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

from infernetes.runtime.engine.input_processor import Prompt
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.multimodal.chat_parts import MediaPart, load_media, split_content
from infernetes.runtime.multimodal.media import MediaSettings
from infernetes.runtime.outputs import PoolingRequestOutput, RequestOutput
from infernetes.runtime.qualified_import import qualified_name
from infernetes.runtime.sampling_params import RequestOutputKind, SamplingParams
from infernetes.runtime.server.chat_template import resolve_content_format
from infernetes.runtime.tokenization.mistral import MistralTokenizer

PromptInput = str | list[int] | dict[str, Any]

logger = logging.getLogger(__name__)


def _normalise_prompts(prompts: PromptInput | Sequence[PromptInput]) -> list[Prompt]:
    """One prompt or many: text, token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}``
    / ``{"prompt_embeds": tensor}`` (vLLM's EmbedsPrompt, with ``--enable-prompt-embeds``) /
    ``{"prompt": ..., "multi_modal_data": {"image": ...}, "mm_processor_kwargs": ...}``."""
    if isinstance(prompts, str | dict) or (
        isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
    ):
        prompts = [prompts]
    result: list[Prompt] = []
    for prompt in prompts:
        if isinstance(prompt, dict):
            if "multi_modal_data" in prompt:
                keys = ("prompt", "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs")
                result.append({key: prompt[key] for key in keys if key in prompt})
            elif "prompt_embeds" in prompt:
                result.append({"prompt_embeds": prompt["prompt_embeds"]})
            elif "prompt_token_ids" in prompt:
                result.append(list(prompt["prompt_token_ids"]))
            elif "prompt" in prompt:
                result.append(prompt["prompt"])
            else:
                raise ValueError(
                    "a prompt dict needs 'prompt', 'prompt_token_ids' or 'prompt_embeds'"
                )
        elif isinstance(prompt, str | list | tuple):
            result.append(prompt if isinstance(prompt, str) else list(prompt))
        else:
            raise TypeError(
                f"a prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}"
            )
    return result


class LLM:
    def __init__(self, model: str, **engine_args: Any) -> None:
        from infernetes.schema.config import build_config
        from infernetes.schema.support_check import check_support

        if engine_args.get("logits_processors"):  # classes as well as names, as vLLM's LLM takes
            engine_args["logits_processors"] = [
                qualified_name(p) if isinstance(p, type) else p
                for p in engine_args["logits_processors"]
            ]
        self.config = build_config(model=model, **engine_args)
        for warning in check_support(self.config).warnings:
            logger.warning(warning)
        self.llm_engine = LLMEngine.from_config(self.config)
        self.media = MediaSettings.of(self.config)  # where chat images may come from
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return self.llm_engine.get_default_sampling_params()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt; ``lora_request`` is one adapter for all of them, or one
        (or None, the base model) per prompt."""
        return self._generate_prepared(
            _normalise_prompts(prompts), sampling_params, use_tqdm, priority, lora_request
        )

    def _generate_prepared(
        self,
        prompt_list: list[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        if self.llm_engine.is_pooling:
            raise ValueError("this is an embedding model: use LLM.embed(), not generate()")
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"got {len(params_list)} sampling params for {len(prompt_list)} prompts; "
                    "give one, or one per prompt"
                )
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(prompt_list)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompt_list):
                raise ValueError(
                    f"got {len(loras)} LoRA requests for {len(prompt_list)} prompts; give one, "
                    "or one per prompt"
                )
        return self._run(prompt_list, params_list, priority, use_tqdm, loras)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
        chat_template_content_format: str = "auto",
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Chat turns through the chat template; with a vision-language model, content parts
        may be images (``image_url`` with a data:, file:// or http(s) URL, or ``image_pil``),
        with an audio-language model audio (``input_audio``, ``audio_url``)."""
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer; the engine runs with --skip-tokenizer-init")
        conversations: list[list[dict[str, Any]]] = (
            messages if messages and isinstance(messages[0], list) else [messages]  # type: ignore[list-item]  # one conversation or a list of them
        )
        processor = self.llm_engine.input_processor
        placeholders = (
            None if processor.mm_processor is None else processor.mm_processor.placeholders
        )
        template = chat_template or tokenizer.chat_template or ""
        content_format = resolve_content_format(chat_template_content_format, template)
        prompts: list[Prompt] = []
        for conversation in conversations:
            if isinstance(tokenizer, MistralTokenizer):  # mistral_common encodes, no template
                prompts.append(tokenizer.encode_chat(conversation, None))
                continue
            media: list[MediaPart] = []
            shaped = [
                {
                    **message,
                    "content": split_content(
                        message["content"],
                        f"messages[{i}].content",
                        content_format,
                        media,
                        placeholders,
                    ),
                }
                if isinstance(message.get("content"), list)
                else message
                for i, message in enumerate(conversation)
            ]
            text = tokenizer.apply_chat_template(
                shaped,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
            if media:
                loaded = load_media(media, self.media)
                prompts.append(
                    processor.process_multimodal(text, loaded, mm_processor_kwargs, False)
                )
            else:
                prompts.append(list(tokenizer(text, add_special_tokens=False).input_ids))
        return self._generate_prepared(prompts, sampling_params, use_tqdm)

    def embed(
        self, prompts: PromptInput | Sequence[PromptInput], use_tqdm: bool = False
    ) -> list[PoolingRequestOutput]:
        if not self.llm_engine.is_pooling:
            raise ValueError(
                "this is a generative model: embed() needs an embedding model (task embed)"
            )
        prompt_list = _normalise_prompts(prompts)
        return self._run(prompt_list, [None] * len(prompt_list), None, use_tqdm)

    encode = embed

    def _run(self, prompts, params_list, priority, use_tqdm, loras=None) -> list:
        engine = self.llm_engine
        request_ids = []
        try:
            for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
                request_id = str(next(self._ids))
                if params is not None and params.output_kind != RequestOutputKind.FINAL_ONLY:
                    params = params.clone()  # offline callers want only the final output
                    params.output_kind = RequestOutputKind.FINAL_ONLY
                engine.add_request(
                    request_id,
                    prompt,
                    params,
                    priority=priority[i] if priority else 0,
                    lora_request=loras[i] if loras else None,
                )
                request_ids.append(request_id)
        except Exception:
            engine.abort_request(request_ids)
            raise
        from tqdm.auto import tqdm

        progress = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm)
        finished: dict[str, Any] = {}
        wanted = set(request_ids)
        while wanted - finished.keys():
            for output in engine.step():
                if output.finished and output.request_id in wanted:
                    finished[output.request_id] = output
                    progress.update(1)
        progress.close()
        return [finished[request_id] for request_id in request_ids]

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        self.llm_engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back what ``tags`` name (``weights``, ``kv_cache``), everything by default."""
        self.llm_engine.wake_up(tags)

    def reload_weights(self) -> None:
        """Read the weights from the checkpoint again (after a trainer wrote new ones there)."""
        self.llm_engine.reload_weights()

    def collective_rpc(
        self,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """``Worker.<method>(*args, **kwargs)`` on every rank; their results in rank order."""
        return self.llm_engine.collective_rpc(method, args, kwargs)
