"""POST /v1/completions: one or more prompts (text or token ids), ``n`` choices each, streamed
or whole, with echo, logprobs and usage."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.server.errors import APIError, error_body
from infernetes.runtime.server.logprobs_format import LogprobFormatter
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.prompt_embeds import decode_prompt_embeds
from infernetes.runtime.server.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
    random_id,
)
from infernetes.runtime.server.serving_base import ServingBase, batch_items, guide_from_request
from infernetes.runtime.server.streaming import DONE, engine_stream, merge, sse


async def _tagged(stream: AsyncIterator[Any]) -> AsyncIterator[tuple[int, Any]]:
    async for item in stream:
        yield 0, item


def _prompt_logprobs(positions: list[Any] | None) -> list[dict[int, Any] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt position ``{token_id: {logprob, rank, decoded_token}}``."""
    if positions is None:
        return None
    return [
        None
        if p is None
        else {
            tid: {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
            for tid, lp in p.items()
        }
        for p in positions
    ]


class PreparedPrompt:
    def __init__(self, text: str | None, token_ids: list[int], embeds: Any = None) -> None:
        self.text = text
        self.token_ids = token_ids
        self.embeds = embeds  # a tensor [num_prompt_tokens, hidden] given as prompt_embeds

    @property
    def length(self) -> int:
        return len(self.token_ids) if self.embeds is None else int(self.embeds.shape[0])

    @property
    def engine_prompt(self) -> Any:
        return self.token_ids if self.embeds is None else {"prompt_embeds": self.embeds}


class CompletionServing(ServingBase):
    def _prompts(self, request: CompletionRequest) -> list[PreparedPrompt]:
        """vLLM's order: the prompts given as embeddings, then those given as text or ids."""
        prompts = self._embeds_prompts(request)
        if request.prompt is not None:
            prompts += self._token_prompts(request)
        return prompts

    def _embeds_prompts(self, request: CompletionRequest) -> list[PreparedPrompt]:
        if request.prompt_embeds is None:
            return []
        items = [request.prompt_embeds] if isinstance(request.prompt_embeds, str) else []
        items = items or list(request.prompt_embeds)
        if request.echo:
            raise APIError("echo is not supported with prompt_embeds", 400, "echo")
        processor = getattr(self.engine, "input_processor", None)
        if processor is not None:  # before reading them: the server may take none
            try:
                processor.check_embeds_taken()
            except ValueError as error:
                raise APIError(str(error), 400, "prompt_embeds") from error
        prompts = []
        for i, item in enumerate(items):
            param = "prompt_embeds" if len(items) == 1 else f"prompt_embeds[{i}]"
            embeds = decode_prompt_embeds(item, param)
            if request.truncate_prompt_tokens:
                embeds = embeds[-request.truncate_prompt_tokens :]
            prompts.append(PreparedPrompt(None, [], embeds))
        return prompts

    def _token_prompts(self, request: CompletionRequest) -> list[PreparedPrompt]:
        add_special = True if request.add_special_tokens is None else request.add_special_tokens
        items = batch_items(request.prompt)
        prompts = []
        for i, item in enumerate(items):
            param = "prompt" if len(items) == 1 else f"prompt[{i}]"
            if isinstance(item, str):
                ids = self.tokenize(item, add_special, request.truncate_prompt_tokens)
                prompts.append(PreparedPrompt(item, ids))
            else:
                ids = self.check_token_ids(list(item), param)
                if request.truncate_prompt_tokens:
                    ids = ids[-request.truncate_prompt_tokens :]
                prompts.append(PreparedPrompt(None, ids))
        return prompts

    def _prepare(
        self, request: CompletionRequest
    ) -> tuple[list[PreparedPrompt], list[Any], LoRARequest | None]:
        lora = self.check_model(request.model)
        self.check_engine()
        if request.suffix is not None:
            raise APIError("suffix is not supported", 400, "suffix")
        if request.max_tokens == 0 and not request.echo:
            raise APIError(
                "max_tokens must be at least 1 (0 only scores the prompt, with echo)",
                400,
                "max_tokens",
            )
        if request.best_of is not None and request.best_of != request.n:
            raise APIError("best_of other than n is not supported", 400, "best_of")
        prompts = self._prompts(request)
        guide = guide_from_request(request)
        params_list = []
        for prompt in prompts:
            # Scoring alone still runs one step (the engine samples at least one token), which
            # is dropped from the answer.
            wanted = 1 if request.scores_prompt_only else request.max_tokens
            max_tokens = self.resolve_max_tokens(prompt.length, wanted, "prompt")
            params_list.append(
                self.sampling_params(
                    request,
                    max_tokens=max_tokens,
                    logprobs=request.logprobs,
                    stream=bool(request.stream),
                    guide=guide,
                    prompt_logprobs=request.logprobs
                    if request.echo and request.logprobs is not None
                    else None,
                )
            )
        return prompts, params_list, lora

    def _generators(
        self,
        request_id: str,
        prompts: list[PreparedPrompt],
        params_list: list[Any],
        priority: int,
        lora: LoRARequest | None,
    ) -> list[AsyncIterator[Any]]:
        generators = []
        for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
            sub_id = f"{request_id}-{i}"
            self.log_request(sub_id, prompt.text, prompt.token_ids, params)
            stream = self.engine.generate(
                prompt.engine_prompt, params, sub_id, priority=priority, lora_request=lora
            )
            generators.append(engine_stream(stream))
        return generators

    def _echo_text(self, prompt: PreparedPrompt) -> str:
        if prompt.text is not None:
            return prompt.text
        return self.tokenizer.decode(prompt.token_ids)

    async def create(self, request: CompletionRequest) -> CompletionResponse | AsyncIterator[bytes]:
        prompts, params_list, lora = await off_loop(self._prepare, request)
        request_id = random_id("cmpl")
        generators = self._generators(request_id, prompts, params_list, request.priority, lora)
        if request.stream:
            return self._stream(request, request_id, prompts, generators)
        return await self._whole(request, request_id, prompts, generators)

    async def _whole(
        self,
        request: CompletionRequest,
        request_id: str,
        prompts: list[PreparedPrompt],
        generators: list[AsyncIterator[Any]],
    ) -> CompletionResponse:
        finals: list[Any] = [None] * len(prompts)
        async for index, output in merge(generators):
            finals[index] = output
        formatter = LogprobFormatter(self.tokenizer, self._token_ids_mode(request))
        choices = []
        usage = UsageInfo()
        for p_index, (prompt, final) in enumerate(zip(prompts, finals, strict=True)):
            usage.prompt_tokens += prompt.length
            cached = getattr(final, "num_cached_tokens", 0) or 0
            for out in sorted(final.outputs, key=lambda o: o.index):
                scoring = request.scores_prompt_only
                text = "" if scoring else out.text
                token_ids = [] if scoring else list(out.token_ids)
                logprobs_list = [] if scoring else out.logprobs
                echo_text = self._echo_text(prompt) if request.echo else ""
                logprobs = None
                if request.logprobs is not None:
                    if request.echo:
                        logprobs = formatter.completion(
                            prompt.token_ids + token_ids,
                            list(final.prompt_logprobs or [None] * len(prompt.token_ids))
                            + list(logprobs_list or []),
                            request.logprobs,
                        )
                    else:
                        logprobs = formatter.completion(
                            token_ids, logprobs_list or [], request.logprobs
                        )
                choices.append(
                    CompletionChoice(
                        index=p_index * request.n + out.index,
                        text=echo_text + text,
                        logprobs=logprobs,
                        finish_reason=out.finish_reason,
                        stop_reason=out.stop_reason,
                        prompt_logprobs=_prompt_logprobs(final.prompt_logprobs)
                        if request.prompt_logprobs is not None
                        else None,
                    )
                )
                usage.completion_tokens += len(token_ids)
            if self.settings.enable_prompt_tokens_details:
                details = usage.prompt_tokens_details or PromptTokensDetails()
                details.cached_tokens += cached
                usage.prompt_tokens_details = details
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return CompletionResponse(
            id=request_id,
            model=self._model_name(request),
            choices=choices,
            usage=usage,
            kv_transfer_params=finals[0].kv_transfer_params,  # the first prompt's, as vLLM's
        )

    async def _stream(
        self,
        request: CompletionRequest,
        request_id: str,
        prompts: list[PreparedPrompt],
        generators: list[AsyncIterator[Any]],
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        model = self._model_name(request)
        formatter = LogprobFormatter(self.tokenizer, self._token_ids_mode(request))
        include_usage, continuous = self.stream_usage(request.stream_options)
        completion_tokens = 0
        cached_tokens = 0
        echoed: set[int] = set()
        offsets: dict[int, int] = {}
        prompt_tokens = sum(p.length for p in prompts)
        # Every chunk shares its head; serialising it once keeps the per-token cost to the text.
        head = (
            'data: {"id":'
            + json.dumps(request_id)
            + ',"object":"text_completion","created":'
            + str(created)
            + ',"model":'
            + json.dumps(model)
            + ',"choices":[{"index":'
        )
        # One prompt (the common case) skips the merging task machinery.
        source = merge(generators) if len(generators) > 1 else _tagged(generators[0])
        try:
            async for p_index, output in source:
                prompt = prompts[p_index]
                if output.finished:
                    cached_tokens += getattr(output, "num_cached_tokens", 0) or 0
                for out in output.outputs:
                    index = p_index * request.n + out.index
                    scoring = request.scores_prompt_only
                    text = "" if scoring else out.text
                    # The engine's sequences as they are: copied only when echo prepends to them.
                    token_ids = () if scoring else out.token_ids
                    logprobs_list = () if scoring else (out.logprobs or ())
                    generated = len(token_ids)
                    if request.echo and index not in echoed:
                        echoed.add(index)
                        text = self._echo_text(prompt) + text
                        if request.logprobs is not None:
                            token_ids = prompt.token_ids + list(token_ids)
                            logprobs_list = [
                                *(output.prompt_logprobs or [None] * len(prompt.token_ids)),
                                *logprobs_list,
                            ]
                    completion_tokens += generated
                    if not text and not token_ids and out.finish_reason is None:
                        continue
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = formatter.completion(
                            token_ids, logprobs_list, request.logprobs, offsets.get(index, 0)
                        )
                        offsets[index] = offsets.get(index, 0) + len(text)
                    parts = [
                        head,
                        str(index),
                        ',"text":',
                        json.dumps(text, ensure_ascii=False),
                        ',"logprobs":',
                        json.dumps(logprobs.model_dump()) if logprobs else "null",
                        ',"finish_reason":',
                        json.dumps(out.finish_reason),
                        ',"stop_reason":',
                        json.dumps(out.stop_reason),
                        "}]",
                    ]
                    if include_usage and continuous:
                        parts += [
                            ',"usage":',
                            json.dumps(self._usage(prompt_tokens, completion_tokens, None)),
                        ]
                    parts.append("}\n\n")
                    yield "".join(parts).encode()
            if include_usage:
                yield sse(
                    {
                        "id": request_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": self._usage(prompt_tokens, completion_tokens, cached_tokens),
                    }
                )
        except APIError as exc:
            yield sse(error_body(exc.message, exc.status, exc.param))
        yield DONE

    def _usage(self, prompt_tokens: int, completion_tokens: int, cached: int | None) -> dict:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached is not None and self.settings.enable_prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _model_name(self, request: CompletionRequest) -> str:
        return request.model or self.settings.model_name

    def _token_ids_mode(self, request: CompletionRequest) -> bool:
        if request.return_tokens_as_token_ids is not None:
            return request.return_tokens_as_token_ids
        return self.settings.return_tokens_as_token_ids
