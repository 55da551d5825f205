"""POST /v1/chat/completions: template the conversation, generate, then split the output into
reasoning, content and tool calls, streamed or whole.

tool_choice: ``none`` (no parsing), ``auto`` (the --tool-call-parser finds calls in free text),
``required`` (the output is constrained to a JSON list of calls) and a named function (the output
is constrained to that function's parameters).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from infernetes.runtime.multimodal.inputs import MultiModalPrompt
from infernetes.runtime.sampling_params import SamplingParams, StructuredOutputsParams
from infernetes.runtime.server.chat_template import ChatRenderer
from infernetes.runtime.server.errors import APIError, error_body
from infernetes.runtime.server.logprobs_format import LogprobFormatter
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.protocol import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    FunctionCall,
    NamedToolChoice,
    PromptTokensDetails,
    ToolCall,
    UsageInfo,
    random_id,
)
from infernetes.runtime.server.reasoning import ReasoningParser, ReasoningStream
from infernetes.runtime.server.serving_base import ServingBase, guide_from_request
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.streaming import DONE, engine_stream, sse
from infernetes.runtime.server.tool_parsers import (
    RequiredCallsParser,
    ToolCallStream,
    ToolParser,
    make_tool_parser,
)

if TYPE_CHECKING:
    from infernetes.runtime.engine.async_engine import AsyncEngine
    from infernetes.runtime.lora.request import LoRARequest


@dataclass
class ToolMode:
    kind: str  # none | auto | required | named
    parser: ToolParser | None = None  # auto: --tool-call-parser's; required: the list of calls
    function: str = ""  # the tool's name when kind is "named"


def required_calls_schema(request: ChatCompletionRequest) -> dict[str, Any]:
    """JSON schema of a non-empty list of calls to the request's tools (tool_choice=required)."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "parameters": tool.function.parameters or {"type": "object"},
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for tool in request.tools or []
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


def _template_kwargs(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The request's chat_template_kwargs, with its ``reasoning_effort`` (the OpenAI field) unless
    they name one themselves; the server's --reasoning-effort fills in below both."""
    kwargs = request.chat_template_kwargs
    if request.reasoning_effort is None:
        return kwargs
    return {"reasoning_effort": request.reasoning_effort, **(kwargs or {})}


class PreparedChat(NamedTuple):
    """A checked chat request, ready for the engine."""

    mode: ToolMode
    prompt_ids: list[int]
    params: SamplingParams
    lora: LoRARequest | None  # the adapter its model name selects
    prompt: list[int] | MultiModalPrompt  # what the engine gets: with images, processed


@dataclass
class ChoiceState:
    """Streaming state of one choice."""

    reasoning: ReasoningStream | None
    tools: ToolCallStream | None
    sent_named_header: bool = False
    tool_calls_sent: int = 0


class ChatServing(ServingBase):
    def __init__(
        self,
        engine: AsyncEngine,
        settings: FrontendSettings,
        renderer: ChatRenderer,
        reasoning_parser: ReasoningParser | None,
    ) -> None:
        super().__init__(engine, settings)
        self.renderer = renderer
        self.reasoning_parser = reasoning_parser

    # ------------------------------------------------------------ preparing

    def _reasoning_parser(self, request: ChatCompletionRequest) -> ReasoningParser | None:
        """The reasoning parser of this request (a hybrid model's depends on whether its
        template was told to think)."""
        if self.reasoning_parser is None:
            return None
        return self.reasoning_parser.for_request(
            self.renderer.template_kwargs(_template_kwargs(request))
        )

    def _tool_mode(self, request: ChatCompletionRequest) -> ToolMode:
        choice = request.tool_choice
        if not request.tools or choice == "none":
            return ToolMode("none")
        if isinstance(choice, NamedToolChoice):
            return ToolMode("named", function=choice.function.name)
        if choice == "required":
            return ToolMode("required", parser=RequiredCallsParser(request.tools))
        parser = self.settings.tool_call_parser if self.settings.enable_auto_tool_choice else None
        if choice is None and not parser:
            return ToolMode("none")
        if not parser:
            raise APIError(
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set",
                400,
                "tool_choice",
            )
        return ToolMode("auto", parser=make_tool_parser(parser, request.tools))

    def _guide(
        self, request: ChatCompletionRequest, mode: ToolMode
    ) -> StructuredOutputsParams | None:
        guide = guide_from_request(request)
        if mode.kind in ("named", "required") and guide is not None:
            raise APIError(
                f"tool_choice {mode.kind!r} cannot be combined with {guide.param}",
                400,
                "tool_choice",
            )
        if mode.kind == "named":
            tool = next(t for t in request.tools or [] if t.function.name == mode.function)
            return StructuredOutputsParams(
                "json", tool.function.parameters or {"type": "object"}, "tools"
            )
        if mode.kind == "required":
            return StructuredOutputsParams("json", required_calls_schema(request), "tools")
        return guide

    def _prompt(self, request: ChatCompletionRequest) -> list[int] | MultiModalPrompt:
        # As vLLM: the tools are in the prompt whenever given, even with tool_choice none
        # (the model only may not call them), unless --exclude-tools-when-tool-choice-none.
        excluded = (
            request.tool_choice == "none" and self.settings.exclude_tools_when_tool_choice_none
        )
        tools = (
            [t.model_dump(exclude_none=True) for t in request.tools]
            if request.tools and not excluded
            else None
        )
        return self.chat_prompt(
            self.renderer,
            request.messages,
            add_special_tokens=bool(request.add_special_tokens),
            template=request.chat_template,
            tools=tools,
            documents=request.documents,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            template_kwargs=_template_kwargs(request),
            processor_kwargs=request.mm_processor_kwargs,
            truncate=request.truncate_prompt_tokens,
        )

    def _prepare(self, request: ChatCompletionRequest) -> PreparedChat:
        lora = self.check_model(request.model)
        self.check_engine()
        mode = self._tool_mode(request)
        guide = self._guide(request, mode)
        prompt = self._prompt(request)
        prompt_ids = prompt if isinstance(prompt, list) else prompt.prompt_token_ids
        max_tokens = self.resolve_max_tokens(
            len(prompt_ids), request.effective_max_tokens, "messages"
        )
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.sampling_params(
            request,
            max_tokens=max_tokens,
            logprobs=logprobs,
            stream=bool(request.stream),
            guide=guide,
        )
        reasoning_parser = self._reasoning_parser(request)
        if (mode.parser is not None and mode.parser.keeps_special_tokens) or (
            reasoning_parser is not None and reasoning_parser.keeps_special_tokens
        ):
            params.skip_special_tokens = False
        return PreparedChat(mode, prompt_ids, params, lora, prompt)

    async def create(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | AsyncIterator[bytes]:
        mode, prompt_ids, params, lora, prompt = await off_loop(self._prepare, request)
        request_id = random_id("chatcmpl")
        self.log_request(request_id, None, prompt_ids, params)
        stream = engine_stream(
            self.engine.generate(
                prompt,
                params,
                request_id,
                priority=request.priority,
                lora_request=lora,
            )
        )
        if request.stream:
            return self._stream(request, request_id, prompt_ids, mode, stream)
        return await self._whole(request, request_id, prompt_ids, mode, stream)

    # ------------------------------------------------------------ whole responses

    def _echo_prefix(self, request: ChatCompletionRequest) -> str:
        last = request.messages[-1]
        if (
            request.echo
            and last.role == self.settings.response_role
            and isinstance(last.content, str)
        ):
            return last.content
        return ""

    def _message(
        self, request: ChatCompletionRequest, mode: ToolMode, text: str, finish: str | None
    ) -> tuple[ChatMessageOut, bool]:
        reasoning = None
        content: str | None = text
        reasoning_parser = self._reasoning_parser(request)
        if reasoning_parser is not None:
            split = reasoning_parser.split(text)
            reasoning, content = split.reasoning, split.content
        role = self.settings.response_role
        if mode.kind == "named":
            call = ToolCall(function=FunctionCall(name=mode.function, arguments=content or ""))
            return ChatMessageOut(
                role=role, content="", reasoning_content=reasoning, tool_calls=[call]
            ), False
        raw = mode.parser is not None and mode.parser.reads_raw_output
        if mode.parser is not None and (content or raw):
            # Cut by max_tokens, the calls closed before the cut (as streamed) and never the
            # raw text of the one being written.
            extracted = mode.parser.extract(text if raw else content or "", cut=finish == "length")
            if extracted.tools_called:
                return ChatMessageOut(
                    role=role,
                    content=extracted.content,
                    reasoning_content=reasoning,
                    tool_calls=extracted.tool_calls,
                ), bool(extracted.tool_calls)
            if raw:
                content = extracted.content
        return ChatMessageOut(
            role=role,
            content=self._echo_prefix(request) + (content or ""),
            reasoning_content=reasoning,
        ), False

    async def _whole(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        prompt_ids: list[int],
        mode: ToolMode,
        stream: AsyncIterator[Any],
    ) -> ChatCompletionResponse:
        final = None
        async for output in stream:
            final = output
        assert final is not None
        formatter = LogprobFormatter(self.tokenizer, self._token_ids_mode(request))
        choices = []
        completion_tokens = 0
        for out in sorted(final.outputs, key=lambda o: o.index):
            message, called = self._message(request, mode, out.text, out.finish_reason)
            finish = "tool_calls" if called and out.finish_reason == "stop" else out.finish_reason
            logprobs = None
            if request.logprobs:
                logprobs = ChatChoiceLogprobs(
                    content=formatter.chat(
                        list(out.token_ids), list(out.logprobs or []), request.top_logprobs or 0
                    )
                )
            choices.append(
                ChatChoice(
                    index=out.index,
                    message=message,
                    logprobs=logprobs,
                    finish_reason=finish,
                    stop_reason=out.stop_reason,
                )
            )
            completion_tokens += len(out.token_ids)
        usage = UsageInfo(
            prompt_tokens=len(prompt_ids),
            completion_tokens=completion_tokens,
            total_tokens=len(prompt_ids) + completion_tokens,
        )
        if self.settings.enable_prompt_tokens_details:
            usage.prompt_tokens_details = PromptTokensDetails(
                cached_tokens=getattr(final, "num_cached_tokens", 0) or 0
            )
        return ChatCompletionResponse(
            id=request_id,
            model=request.model or self.settings.model_name,
            choices=choices,
            usage=usage,
            kv_transfer_params=getattr(final, "kv_transfer_params", None),
        )

    # ------------------------------------------------------------ streaming

    def _new_state(self, request: ChatCompletionRequest, mode: ToolMode) -> ChoiceState:
        reasoning_parser = self._reasoning_parser(request)
        return ChoiceState(
            reasoning=reasoning_parser.stream() if reasoning_parser else None,
            tools=mode.parser.stream() if mode.parser is not None else None,
        )

    def _deltas(
        self, state: ChoiceState, mode: ToolMode, piece: str, finish: str | None
    ) -> list[dict[str, Any]]:
        """The delta objects for one piece of output (and, once it has a finish reason, for
        the rest)."""
        final = finish is not None
        reasoning, content = "", piece
        if state.reasoning is not None:
            reasoning, content = state.reasoning.feed(piece)
            if final:
                more_reasoning, more_content = state.reasoning.finish()
                reasoning += more_reasoning
                content += more_content
        deltas: list[dict[str, Any]] = []
        if reasoning:
            deltas.append({"reasoning_content": reasoning})
        if mode.kind == "named":
            if not state.sent_named_header:
                state.sent_named_header = True
                deltas.append(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": random_id("chatcmpl-tool"),
                                "type": "function",
                                "function": {"name": mode.function, "arguments": ""},
                            }
                        ]
                    }
                )
            if content:
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": content}}]})
            return deltas
        if state.tools is not None:
            source = piece if state.tools.parser.reads_raw_output else content
            pieces = [state.tools.feed(source)] if source else []
            if final:
                pieces.append(state.tools.finish(cut=finish == "length"))
            for delta in pieces:
                if delta.content:
                    deltas.append({"content": delta.content})
                if delta.tool_calls:
                    state.tool_calls_sent = state.tools.calls_sent
                    deltas.append({"tool_calls": [piece.wire() for piece in delta.tool_calls]})
            return deltas
        if content:
            deltas.append({"content": content})
        return deltas

    async def _stream(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        prompt_ids: list[int],
        mode: ToolMode,
        stream: AsyncIterator[Any],
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        model = request.model or self.settings.model_name
        include_usage, continuous = self.stream_usage(request.stream_options)
        formatter = LogprobFormatter(self.tokenizer, self._token_ids_mode(request))
        states = {i: self._new_state(request, mode) for i in range(request.n)}
        completion_tokens = 0
        cached_tokens = 0
        prompt_tokens = len(prompt_ids)
        echo = self._echo_prefix(request)

        def chunk(
            index: int,
            delta: dict[str, Any],
            finish: str | None = None,
            logprobs: Any = None,
            stop_reason: Any = None,
        ) -> bytes:
            body: dict[str, Any] = {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": index,
                        "delta": delta,
                        "logprobs": logprobs,
                        "finish_reason": finish,
                        **({"stop_reason": stop_reason} if finish else {}),
                    }
                ],
            }
            if include_usage and continuous:
                body["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
            return sse(body)

        try:
            for index in states:
                yield chunk(index, {"role": self.settings.response_role, "content": echo})
            async for output in stream:
                if output.finished:
                    cached_tokens = getattr(output, "num_cached_tokens", 0) or 0
                for out in output.outputs:
                    state = states[out.index]
                    completion_tokens += len(out.token_ids)
                    finished = out.finish_reason is not None
                    deltas = self._deltas(state, mode, out.text, out.finish_reason)
                    logprobs = None
                    if request.logprobs and out.token_ids:
                        logprobs = {
                            "content": [
                                lp.model_dump()
                                for lp in formatter.chat(
                                    list(out.token_ids),
                                    list(out.logprobs or []),
                                    request.top_logprobs or 0,
                                )
                            ]
                        }
                    for i, delta in enumerate(deltas):
                        yield chunk(out.index, delta, logprobs=logprobs if i == 0 else None)
                    if logprobs and not deltas:
                        yield chunk(out.index, {}, logprobs=logprobs)
                    if finished:
                        reason = out.finish_reason
                        if state.tool_calls_sent and reason == "stop" and mode.kind != "named":
                            reason = "tool_calls"
                        yield chunk(out.index, {}, finish=reason, stop_reason=out.stop_reason)
            if include_usage:
                usage: dict[str, Any] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
                if self.settings.enable_prompt_tokens_details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
                yield sse(
                    {
                        "id": request_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
        except APIError as exc:
            yield sse(error_body(exc.message, exc.status, exc.param))
        yield DONE

    def _token_ids_mode(self, request: ChatCompletionRequest) -> bool:
        if request.return_tokens_as_token_ids is not None:
            return request.return_tokens_as_token_ids
        return self.settings.return_tokens_as_token_ids
