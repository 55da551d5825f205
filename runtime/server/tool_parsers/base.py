"""What every tool-call parser does: find where the tool-call section of the model's output
starts, and turn that section into function calls, whole or as it streams in.

A parser implements two methods: ``section_start`` (where the tool calls begin, or None) and
``parse_section`` (the calls in the section; with ``final=False`` only those already complete).
Everything else, including streaming, is shared here.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from infernetes.runtime.server.protocol import ChatTool, FunctionCall, ToolCall
from infernetes.runtime.server.text_stream import partial_marker_len


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


@dataclass
class StreamDelta:
    """What one piece of streamed output adds: content text and newly completed tool calls."""

    content: str = ""
    tool_calls: list[tuple[int, ToolCall]] = field(default_factory=list)


def arguments_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def decode_json_values(text: str) -> tuple[list[Any], str]:
    """JSON values one after another (separated by whitespace, ',' or ';'), and the rest."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos >= len(text):
            return values, ""
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return values, text[pos:]
        values.append(value)


def call_from_dict(obj: Any, arguments_key: str = "arguments") -> FunctionCall | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` -> FunctionCall, None if not that shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, obj.get("parameters", obj.get("arguments", {})))
    return FunctionCall(name=obj["name"], arguments=arguments_json(args))


class ToolParser(ABC):
    name: ClassVar[str]
    # Marker strings that may open the tool section; a tail of the output that could still grow
    # into one is held back while streaming.
    markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: list[ChatTool] | None = None) -> None:
        self.tools = tools or []

    @abstractmethod
    def section_start(self, text: str) -> int | None:
        """Index where the tool-call section starts in ``text``, or None when there is none."""

    @abstractmethod
    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        """The calls in ``section``. With ``final`` False, the calls complete so far; with
        ``final`` True, all of them, or None if the section is not valid tool-call syntax."""

    def hold_back(self, text: str) -> int:
        """How many trailing characters of not-yet-tool text to keep from the content stream."""
        return partial_marker_len(text, self.markers)

    def extract(self, text: str) -> ExtractedToolCalls:
        start = self.section_start(text)
        if start is None:
            return ExtractedToolCalls(False, [], text)
        calls = self.parse_section(text[start:], final=True)
        if not calls:
            return ExtractedToolCalls(False, [], text)
        content = text[:start].strip() or None
        return ExtractedToolCalls(True, [ToolCall(function=c) for c in calls], content)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self)


class ToolCallStream:
    """Turns the output of one choice, piece by piece, into content and tool-call deltas."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.content_sent = 0
        self.section_at: int | None = None
        self.calls_sent = 0

    @property
    def tools_called(self) -> bool:
        return self.calls_sent > 0

    def feed(self, piece: str) -> StreamDelta:
        self.text += piece
        delta = StreamDelta()
        if self.section_at is None:
            start = self.parser.section_start(self.text)
            if start is None:
                safe = len(self.text) - self.parser.hold_back(self.text)
                delta.content = self.text[self.content_sent:safe]
                self.content_sent = max(self.content_sent, safe)
                return delta
            delta.content = self.text[self.content_sent:start]
            self.content_sent = start
            self.section_at = start
        calls = self.parser.parse_section(self.text[self.section_at:], final=False) or []
        delta.tool_calls = self._new_calls(calls)
        return delta

    def finish(self) -> StreamDelta:
        """Flushes what is left when generation ends."""
        delta = StreamDelta()
        if self.section_at is not None:
            calls = self.parser.parse_section(self.text[self.section_at:], final=True) or []
            delta.tool_calls = self._new_calls(calls)
            if self.tools_called:
                return delta
        delta.content = self.text[self.content_sent:]
        self.content_sent = len(self.text)
        return delta

    def _new_calls(self, calls: list[FunctionCall]) -> list[tuple[int, ToolCall]]:
        new = [(i, ToolCall(function=c)) for i, c in enumerate(calls) if i >= self.calls_sent]
        self.calls_sent = max(self.calls_sent, len(calls))
        return new
