"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API over the chat path.

A request becomes a chat completion: ``instructions`` a system message, the stored conversation
of ``previous_response_id`` next, then ``input`` (text, or items: messages, ``function_call`` and
``function_call_output``); function tools, ``tool_choice`` and ``text.format`` map onto the chat
fields that already do the same. The answer's message, reasoning and function calls become output
items; streamed, they arrive as the Responses events. Responses are kept (unless ``store: false``)
in a bounded in-memory store, oldest dropped first, for ``GET`` and ``previous_response_id``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from infernetes.runtime.server.errors import APIError, error_body
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ResponsesRequest,
    random_id,
)
from infernetes.runtime.server.serving_base import ContextLengthError
from infernetes.runtime.server.serving_chat import ChatServing
from infernetes.runtime.server.streaming import engine_stream, sse
from pydantic import ValidationError

# Responses kept for GET and previous_response_id; the oldest goes first.
STORE_LIMIT = 1024


class ResponseStore:
    """Stored responses and the conversation that led to each (the messages after the
    instructions, the answer included)."""

    def __init__(self, limit: int = STORE_LIMIT) -> None:
        self.limit = limit
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._items[response["id"]] = (response, conversation)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> tuple[dict, list[dict]]:
        if response_id not in self._items:
            raise APIError(f"Response with id '{response_id}' not found.", 404, param)
        return self._items[response_id]


# The Responses API's media parts, spelled as chat parts are (``multimodal/chat_parts.py``)
MEDIA_PARTS = ("input_image", "input_audio")


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in (
                "input_text",
                "output_text",
                "text",
            ):
                raise APIError(
                    f"{param}[{i}]: only input_text and output_text parts are supported",
                    400,
                    f"{param}[{i}]",
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise APIError(f"{param} must be a string or a list of text parts", 400, param)


def _is_media(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in MEDIA_PARTS


def _message_content(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A message's content: its text, or with ``input_image`` or ``input_audio`` parts the
    chat's content parts (text and media in their order)."""
    if not isinstance(content, list) or not any(_is_media(part) for part in content):
        return _text_of(content, param)
    return [
        part if _is_media(part) else {"type": "text", "text": _text_of([part], f"{param}[{i}]")}
        for i, part in enumerate(content)
    ]


def input_messages(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's ``input`` as chat messages."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message" and "role" in item:
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _message_content(item.get("content"), param)})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _text_of(item.get("output", ""), f"{param}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # earlier reasoning is not shown to the model again
        else:
            raise APIError(f"{param}: input items of type {kind!r} are not supported", 400, param)
    return messages


def _chat_fields(request: ResponsesRequest) -> dict[str, Any]:
    """The chat completion fields that do what the request's fields ask."""
    fields: dict[str, Any] = {
        "model": request.model,
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "user": request.user,
        "parallel_tool_calls": request.parallel_tool_calls,
        "vllm_xargs": request.vllm_xargs,
        "chat_template_kwargs": request.chat_template_kwargs,
    }
    if request.tools:
        tools = []
        for i, tool in enumerate(request.tools):
            if tool.type != "function" or not tool.name:
                raise APIError(
                    f"tools[{i}]: only function tools (with a name) are supported, "
                    f"not {tool.type!r}",
                    400,
                    f"tools[{i}].type",
                )
            function: dict[str, Any] = {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            }
            tools.append({"type": "function", "function": function})
        fields["tools"] = tools
        choice = request.tool_choice
        fields["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}}
            if not isinstance(choice, str)
            else choice
        )
    fmt = request.text.format if request.text else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError("text.format.schema is required for json_schema", 400, "text.format")
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict},
        }
    elif fmt is not None and fmt.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    if request.reasoning and request.reasoning.effort:
        fields["reasoning_effort"] = request.reasoning.effort
    return {k: v for k, v in fields.items() if v is not None}


def message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": random_id("msg"),
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": random_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def reasoning_item(text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": random_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def item_status(item: dict[str, Any], finish_reason: str | None) -> str:
    """An output item's final status: the message of a response cut at max_output_tokens is
    incomplete, as OpenAI's (and vLLM's) say; every other item completed."""
    return "incomplete" if item["type"] == "message" and finish_reason == "length" else "completed"


def _without_oldest_item(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation less its first item, and less the tool results whose call that was."""
    rest = messages[1:]
    while rest and rest[0]["role"] == "tool":
        rest = rest[1:]
    return rest


class ResponsesServing:
    def __init__(self, chat: ChatServing, store: ResponseStore | None = None) -> None:
        self.chat = chat
        self.store = store or ResponseStore()

    def _conversation(self, request: ResponsesRequest) -> tuple[list[dict], ChatCompletionRequest]:
        history: list[dict[str, Any]] = []
        if request.previous_response_id:
            _, history = self.store.get(request.previous_response_id, "previous_response_id")
        conversation = [*history, *input_messages(request.input)]
        chat_request = self._chat_request(request, conversation)
        if request.truncation == "auto":
            chat_request = self._truncated(request, conversation, chat_request)
        return conversation, chat_request

    def _truncated(
        self,
        request: ResponsesRequest,
        conversation: list[dict[str, Any]],
        chat_request: ChatCompletionRequest,
    ) -> ChatCompletionRequest:
        """``truncation: "auto"``: the oldest items of the conversation are dropped until the
        prompt and max_output_tokens fit the model's context (instructions always stay; a tool
        result goes with its call). "disabled" leaves the chat path's 400."""
        kept = conversation
        while True:
            try:
                self.chat._prepare(chat_request)
                return chat_request
            except ContextLengthError:
                kept = _without_oldest_item(kept)
                if not kept:
                    raise
                chat_request = self._chat_request(request, kept)

    def _chat_request(
        self, request: ResponsesRequest, conversation: list[dict[str, Any]]
    ) -> ChatCompletionRequest:
        system = (
            [{"role": "system", "content": request.instructions}] if request.instructions else []
        )
        try:
            chat_request = ChatCompletionRequest.model_validate(
                {
                    **_chat_fields(request),
                    "messages": system + conversation,
                    "stream": request.stream,
                }
            )
        except ValidationError as exc:  # what the input items became cannot be a chat
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            param = "input" if where.startswith("messages") else where or None
            raise APIError(f"{param or 'body'}: {first.get('msg', 'invalid')}", 400, param) from exc
        return chat_request

    def _response(
        self,
        request: ResponsesRequest,
        response_id: str,
        created: int,
        output: list[dict[str, Any]],
        usage: tuple[int, int],
        finish_reason: str | None,
        status: str = "completed",
    ) -> dict[str, Any]:
        incomplete = finish_reason == "length"
        prompt_tokens, output_tokens = usage
        for item in output:
            item["status"] = item_status(item, finish_reason)
        return {
            "id": response_id,
            "object": "response",
            "created_at": created,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": request.model or self.chat.settings.model_name,
            "output": output,
            "parallel_tool_calls": request.parallel_tool_calls,
            "previous_response_id": request.previous_response_id,
            "temperature": request.temperature,
            "text": {"format": {"type": "text"}}
            if request.text is None
            else request.text.model_dump(by_alias=True, exclude_none=True),
            "tool_choice": request.tool_choice
            if isinstance(request.tool_choice, str)
            else request.tool_choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True) for t in request.tools or []],
            "top_p": request.top_p,
            "truncation": request.truncation,
            "metadata": request.metadata or {},
            "store": request.store,
            "user": request.user,
            "usage": {
                "input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt_tokens + output_tokens,
            },
        }

    def _keep(self, request: ResponsesRequest, response: dict, conversation: list[dict]) -> None:
        if not request.store:
            return
        answer: list[dict[str, Any]] = []
        for item in response["output"]:
            if item["type"] == "message":
                answer.append({"role": "assistant", "content": item["content"][0]["text"]})
            elif item["type"] == "function_call":
                answer.extend(input_messages([item]))
        self.store.put(response, [*conversation, *answer])

    async def create(self, request: ResponsesRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        conversation, chat_request = await off_loop(self._conversation, request)
        response_id = random_id("resp")
        created = int(time.time())
        if request.stream:
            return self._stream(request, chat_request, conversation, response_id, created)
        answer = await self.chat.create(chat_request)
        if not isinstance(answer, ChatCompletionResponse):  # chat_request is not streamed
            raise TypeError(f"expected a whole chat completion, got {type(answer).__name__}")
        choice = answer.choices[0]
        output = []
        if choice.message.reasoning_content:
            output.append(reasoning_item(choice.message.reasoning_content))
        if choice.message.content:
            output.append(message_item(choice.message.content))
        for call in choice.message.tool_calls:
            output.append(function_call_item(call.id, call.function.name, call.function.arguments))
        usage = (answer.usage.prompt_tokens, answer.usage.completion_tokens)
        response = self._response(
            request, response_id, created, output, usage, choice.finish_reason
        )
        self._keep(request, response, conversation)
        return response

    def get(self, response_id: str) -> dict[str, Any]:
        return self.store.get(response_id)[0]

    async def _stream(
        self,
        request: ResponsesRequest,
        chat_request: ChatCompletionRequest,
        conversation: list[dict],
        response_id: str,
        created: int,
    ) -> AsyncIterator[bytes]:
        events = ResponseEvents()
        output: list[dict[str, Any]] = []
        started = self._response(request, response_id, created, [], (0, 0), None, "in_progress")
        yield events.send("response.created", response=started)
        yield events.send("response.in_progress", response=started)
        try:
            mode, prompt_ids, params, lora, prompt = await off_loop(
                self.chat._prepare, chat_request
            )
            self.chat.log_request(response_id, None, prompt_ids, params)
            stream = engine_stream(
                self.chat.engine.generate(
                    prompt,
                    params,
                    response_id,
                    priority=0,
                    lora_request=lora,
                )
            )
            state = self.chat._new_state(chat_request, mode)
            message: dict[str, Any] | None = None
            reasoning: dict[str, Any] | None = None
            calls: dict[int, dict[str, Any]] = {}
            output_tokens, finish_reason = 0, None
            async for step in stream:
                out = step.outputs[0]
                output_tokens += len(out.token_ids)
                finish_reason = out.finish_reason
                for delta in self.chat._deltas(state, mode, out.text, finish_reason):
                    if delta.get("reasoning_content"):
                        if reasoning is None:
                            reasoning = reasoning_item("")
                            reasoning["status"] = "in_progress"
                            output.append(reasoning)
                            yield events.send(
                                "response.output_item.added",
                                output_index=len(output) - 1,
                                item={**reasoning, "content": []},
                            )
                        reasoning["content"][0]["text"] += delta["reasoning_content"]
                        yield events.send(
                            "response.reasoning_text.delta",
                            item_id=reasoning["id"],
                            output_index=output.index(reasoning),
                            content_index=0,
                            delta=delta["reasoning_content"],
                        )
                    if delta.get("content"):
                        if message is None:
                            message = message_item("")
                            message["status"] = "in_progress"
                            output.append(message)
                            for chunk in events.open_message(message, len(output) - 1):
                                yield chunk
                        message["content"][0]["text"] += delta["content"]
                        yield events.send(
                            "response.output_text.delta",
                            item_id=message["id"],
                            output_index=output.index(message),
                            content_index=0,
                            delta=delta["content"],
                            logprobs=[],
                        )
                    for piece in delta.get("tool_calls") or []:
                        call = calls.get(piece["index"])
                        function = piece.get("function") or {}
                        if call is None:
                            call = function_call_item(
                                piece.get("id") or random_id("call"), function.get("name", ""), ""
                            )
                            call["status"] = "in_progress"
                            calls[piece["index"]] = call
                            output.append(call)
                            yield events.send(
                                "response.output_item.added",
                                output_index=len(output) - 1,
                                item=dict(call),
                            )
                        if function.get("arguments"):
                            call["arguments"] += function["arguments"]
                            yield events.send(
                                "response.function_call_arguments.delta",
                                item_id=call["id"],
                                output_index=output.index(call),
                                delta=function["arguments"],
                            )
            for index, item in enumerate(output):
                for chunk in events.close_item(item, index, item_status(item, finish_reason)):
                    yield chunk
            response = self._response(
                request,
                response_id,
                created,
                output,
                (len(prompt_ids), output_tokens),
                finish_reason,
            )
            self._keep(request, response, conversation)
            kind = "response.incomplete" if response["status"] == "incomplete" else None
            yield events.send(kind or "response.completed", response=response)
        except APIError as exc:
            yield events.send("error", **error_body(exc.message, exc.status, exc.param)["error"])


class ResponseEvents:
    """Server-sent events of the Responses API, numbered in order."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def send(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\n".encode() + sse(body)

    def open_message(self, message: dict[str, Any], index: int) -> list[bytes]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.send(
                "response.output_item.added",
                output_index=index,
                item={**message, "content": []},
            ),
            self.send(
                "response.content_part.added",
                item_id=message["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def close_item(self, item: dict[str, Any], index: int, status: str) -> list[bytes]:
        item["status"] = status
        chunks = []
        if item["type"] == "message":
            part = item["content"][0]
            chunks.append(
                self.send(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            chunks.append(
                self.send(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        elif item["type"] == "function_call":
            chunks.append(
                self.send(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
        elif item["type"] == "reasoning":
            chunks.append(
                self.send(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=item["content"][0]["text"],
                )
            )
        chunks.append(self.send("response.output_item.done", output_index=index, item=item))
        return chunks
