"""``openai``: gpt-oss's tool calls, each a harmony ``commentary`` message to ``functions.NAME``
whose text is the JSON arguments (``harmony.py`` reads the format). The parser reads the whole
raw output, not what a reasoning parser leaves of it: the answer (``final`` channel) is the
content, the reasoning (``analysis``) is left to ``--reasoning-parser openai_gptoss``."""

from __future__ import annotations

from infernetes.runtime.server.harmony import HarmonyPiece, HarmonyReader, read_harmony
from infernetes.runtime.server.protocol import FunctionCall, ToolCall, random_id
from infernetes.runtime.server.tool_parsers.base import (
    ExtractedToolCalls,
    StreamDelta,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
    coalesce,
)


def _calls(pieces: list[HarmonyPiece], completed: int) -> list[FunctionCall]:
    """The calls among the first ``completed`` messages, in order."""
    calls: dict[int, FunctionCall] = {}
    for piece in pieces:
        name = piece.function
        if name is None or piece.message >= completed:
            continue
        call = calls.setdefault(piece.message, FunctionCall(name=name, arguments=""))
        call.arguments += piece.text
    return list(calls.values())


class OpenAIToolParser(ToolParser):
    name = "openai"
    keeps_special_tokens = True
    reads_raw_output = True

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        return _calls(*read_harmony(section, cut=not final))

    def extract(self, text: str, cut: bool = False) -> ExtractedToolCalls:
        pieces, completed = read_harmony(text, cut)
        calls = _calls(pieces, completed)
        content = "".join(p.text for p in pieces if p.visible) or None
        tool_calls = [ToolCall(id=random_id("chatcmpl-tool"), function=c) for c in calls]
        return ExtractedToolCalls(bool(calls), tool_calls, content)

    def stream(self) -> ToolCallStream:
        return HarmonyToolCallStream(self)


class HarmonyToolCallStream(ToolCallStream):
    """Content and calls as harmony output streams: a call's header (id, name) as soon as its
    message names the function, then its arguments as they are generated."""

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser)
        self.reader = HarmonyReader()
        self.indices: dict[int, int] = {}  # message -> tool call index

    @property
    def tools_called(self) -> bool:
        return bool(self.indices)

    @property
    def calls_sent(self) -> int:
        return len(self.indices)

    def feed(self, piece: str) -> StreamDelta:
        return self._delta(self.reader.feed(piece))

    def finish(self, cut: bool = False) -> StreamDelta:
        return self._delta(self.reader.finish(cut))

    def _delta(self, pieces: list[HarmonyPiece]) -> StreamDelta:
        delta = StreamDelta()
        for piece in pieces:
            name = piece.function
            if name is None:
                delta.content += piece.text if piece.visible else ""
                continue
            index = self.indices.get(piece.message)
            if index is None:
                index = self.indices[piece.message] = len(self.indices)
                delta.tool_calls.append(ToolCallDelta(index, "", name, random_id("chatcmpl-tool")))
            if piece.text:
                delta.tool_calls.append(ToolCallDelta(index, piece.text))
        delta.tool_calls = coalesce(delta.tool_calls)
        return delta
