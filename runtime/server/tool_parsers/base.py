"""What every tool-call parser does: find where the tool-call section of the model's output
starts, and turn that section into function calls, whole or as it streams in.

A parser implements two methods: ``section_start`` (where the tool calls begin, or None) and
``parse_section`` (the calls in the section; with ``final=False`` only those already complete),
and may implement ``partial_call`` (the name and the arguments written so far of the call being
generated), which lets a stream send the arguments in pieces as they arrive, as OpenAI clients
expect. The pieces of one call always join up to exactly the arguments ``parse_section`` returns
for it. Everything else, including streaming, is shared here.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from infernetes.runtime.server.protocol import ChatTool, FunctionCall, ToolCall, random_id
from infernetes.runtime.server.text_stream import partial_marker_len


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


@dataclass
class ToolCallDelta:
    """One streamed piece of tool call ``index``: the first piece of a call carries its id and
    name, every piece some of its arguments text."""

    index: int
    arguments: str = ""
    name: str | None = None
    id: str | None = None

    def wire(self) -> dict[str, Any]:
        """The OpenAI ``delta.tool_calls[i]`` object."""
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.name is None:
            return {"index": self.index, "function": function}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, **function},
        }


@dataclass
class StreamDelta:
    """What one piece of streamed output adds: content text and tool-call pieces."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class PartialCall:
    """The call being generated: its name and the text of its arguments so far (a prefix of
    the arguments ``parse_section`` will return for it once complete)."""

    name: str
    arguments: str


def arguments_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def decode_json_spans(text: str) -> tuple[list[tuple[Any, str]], str]:
    """JSON values one after another (separated by whitespace, ',' or ';'), each with the text it
    was decoded from, and the rest that does not decode yet."""
    decoder = json.JSONDecoder()
    values: list[tuple[Any, str]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos >= len(text):
            return values, ""
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return values, text[pos:]
        values.append((value, text[pos:end]))
        pos = end


# A string (to its closing quote, or the end of a string still being written) or a bracket: the
# regex engine skips string contents, which a call's arguments are mostly made of.
JSON_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[{}\[\]]', re.DOTALL)


def scan_json_value(text: str, start: int = 0) -> tuple[int, bool]:
    """How far the JSON object or array opening at ``text[start]`` goes: ``(end, complete)``.

    Tracks nesting and strings only (no validation), so it works on a value still being
    written: everything up to ``end`` belongs to the value."""
    depth = 0
    for match in JSON_STRUCTURE.finditer(text, start):
        token = match.group()
        if token[0] == '"':
            continue
        depth += 1 if token in "{[" else -1
        if depth == 0:
            return match.end(), True
    return len(text), False


# ``{"name": "...", "arguments": `` (or "parameters") at the start of a call object.
CALL_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


def raw_arguments(text: str) -> tuple[str, str, bool] | None:
    """For a call object written name first with object arguments, as models do:
    ``(name, arguments text so far, arguments complete)``; None for any other shape."""
    head = CALL_HEAD.match(text)
    if head is None:
        return None
    name = json.loads(head.group(1))
    start = head.end()
    if start == len(text):
        return name, "", False
    if text[start] != "{":
        return None
    end, complete = scan_json_value(text, start)
    return name, text[start:end], complete


def partial_from_object_text(text: str) -> PartialCall | None:
    """The PartialCall of a call object still being written (see ``raw_arguments``)."""
    found = raw_arguments(text)
    if found is None:
        return None
    return PartialCall(found[0], found[1])


def call_from_dict(
    obj: Any, arguments_key: str = "arguments", raw: str | None = None
) -> FunctionCall | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` -> FunctionCall, None if not that shape.

    With ``raw`` (the text ``obj`` was decoded from), the arguments are the model's own text of
    them when it has the usual shape, so they equal what a stream sent piece by piece."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, obj.get("parameters", obj.get("arguments", {})))
    if raw is not None and isinstance(args, dict):
        found = raw_arguments(raw)
        if found is not None and found[0] == obj["name"] and found[2]:
            return FunctionCall(name=obj["name"], arguments=found[1])
    return FunctionCall(name=obj["name"], arguments=arguments_json(args))


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


class ToolParser(ABC):
    name: ClassVar[str]
    # Marker strings that may open the tool section; a tail of the output that could still grow
    # into one is held back while streaming.
    markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: list[ChatTool] | None = None) -> None:
        self.tools = tools or []

    def section_start(self, text: str) -> int | None:
        """Index where the tool-call section starts in ``text``, or None when there is none.
        By default: the first place one of ``markers`` occurs."""
        found = [i for i in (text.find(marker) for marker in self.markers) if i >= 0]
        return min(found) if found else None

    @abstractmethod
    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        """The calls in ``section``. With ``final`` False, the calls complete so far; with
        ``final`` True, all of them, or None if the section is not valid tool-call syntax."""

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        """The call after the first ``complete`` ones while it is being written, if its name is
        known yet; None (the default) sends each call whole once complete."""
        return None

    def hold_back(self, text: str) -> int:
        """How many trailing characters of not-yet-tool text to keep from the content stream."""
        return partial_marker_len(text, self.markers)

    def unparsed_is_content(self, section: str, cut: bool) -> bool:
        """Whether a tool section that gave no call is the model's text after all. One cut by
        max_tokens (``cut``) is a call being written: its marker said so, and its raw text
        never becomes content."""
        return not cut

    def extract(self, text: str, cut: bool = False) -> ExtractedToolCalls:
        """The calls in a whole output; ``cut`` (by max_tokens): those closed before the cut.
        ``tools_called`` says the tool section was read as calls, none closed if it was cut."""
        start = self.section_start(text)
        if start is None:
            return ExtractedToolCalls(False, [], text)
        section = text[start:]
        calls = self.parse_section(section, final=not cut) or []
        if not calls and self.unparsed_is_content(section, cut):
            return ExtractedToolCalls(False, [], text)
        content = text[:start].strip() or None
        return ExtractedToolCalls(True, [ToolCall(function=c) for c in calls], content)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self)


class TaggedToolParser(ToolParser):
    """Calls each in a block between ``<tool_call>`` and ``</tool_call>`` (Hermes' JSON,
    Qwen3-Coder's XML): the blocks are found here, each read by ``parse_block``."""

    markers = (TOOL_CALL_OPEN,)

    @abstractmethod
    def parse_block(self, body: str) -> FunctionCall | None:
        """The call in one closed block, or None if it is malformed."""

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        calls: list[FunctionCall] = []
        for block in section.split(TOOL_CALL_OPEN)[1:]:
            body, closed, _ = block.partition(TOOL_CALL_CLOSE)
            if not closed and not final:
                break
            call = self.parse_block(body)
            if call is None:
                # A malformed block ends the tool section; with final, it voids it.
                return None if final and not calls else calls
            calls.append(call)
        return calls

    @staticmethod
    def open_block(section: str, complete: int) -> str | None:
        """The text so far of the block after the first ``complete`` ones, while unclosed."""
        blocks = section.split(TOOL_CALL_OPEN)[1:]
        if len(blocks) <= complete or TOOL_CALL_CLOSE in blocks[complete]:
            return None
        return blocks[complete]


class LeadingToolParser(ToolParser):
    """A tool section that can only open the output, with ``tag`` or with ``opener`` (Llama 3's
    JSON object, the pythonic list)."""

    tag: ClassVar[str]
    opener: ClassVar[str]
    # The start of a call after the opener, which plain text does not begin with.
    call_begins: ClassVar[re.Pattern[str]]

    def section_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(self.tag) or stripped.startswith(self.opener):
            return len(text) - len(stripped)
        return None

    def unparsed_is_content(self, section: str, cut: bool) -> bool:
        # The opener ("{", "[") may begin plain text too: cut, it is a call once the tag or
        # the start of a call says so.
        if not cut:
            return True
        stripped = section.lstrip()
        return not stripped.startswith(self.tag) and self.call_begins.match(stripped) is None

    def hold_back(self, text: str) -> int:
        # The section can only open the output: hold leading whitespace and a partial tag.
        stripped = text.lstrip()
        if not stripped or self.tag.startswith(stripped):
            return len(text)
        return 0


class ToolCallStream:
    """Turns the output of one choice, piece by piece, into content and tool-call deltas: a call
    the parser can follow while it is written (``partial_call``) is sent as a header (id, name)
    then arguments pieces; any other call whole once complete."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.content_sent = 0
        self.section_at: int | None = None
        self.calls_done = 0  # calls sent in full
        self.open_id: str | None = None  # the call being sent in pieces (index calls_done)
        self.open_sent = ""  # its arguments sent so far

    @property
    def tools_called(self) -> bool:
        return self.calls_done > 0 or self.open_id is not None

    @property
    def calls_sent(self) -> int:
        """Tool calls started so far (each is counted once, when its first piece is sent)."""
        return self.calls_done + (self.open_id is not None)

    def feed(self, piece: str) -> StreamDelta:
        self.text += piece
        delta = StreamDelta()
        if self.section_at is None:
            start = self.parser.section_start(self.text)
            if start is None:
                safe = len(self.text) - self.parser.hold_back(self.text)
                delta.content = self.text[self.content_sent : safe]
                self.content_sent = max(self.content_sent, safe)
                return delta
            delta.content = self.text[self.content_sent : start]
            self.content_sent = start
            self.section_at = start
        delta.tool_calls = self._advance(final=False)
        return delta

    def finish(self, cut: bool = False) -> StreamDelta:
        """Flushes what is left when generation ends (``cut``: by max_tokens)."""
        delta = StreamDelta()
        if self.section_at is not None:
            delta.tool_calls = self._advance(final=not cut)
            section = self.text[self.section_at :]
            if self.tools_called or not self.parser.unparsed_is_content(section, cut):
                return delta
        delta.content = self.text[self.content_sent :]
        self.content_sent = len(self.text)
        return delta

    def _advance(self, final: bool) -> list[ToolCallDelta]:
        section = self.text[self.section_at :]
        calls = self.parser.parse_section(section, final=final) or []
        out: list[ToolCallDelta] = []
        for index in range(self.calls_done, len(calls)):
            call = calls[index]
            if self.open_id is not None:
                # The rest of the call sent in pieces; its text only grew, so what was sent is
                # a prefix of the whole arguments.
                out.append(ToolCallDelta(index, call.arguments[len(self.open_sent) :]))
                self.open_id, self.open_sent = None, ""
            else:
                out.append(
                    ToolCallDelta(index, call.arguments, call.name, random_id("chatcmpl-tool"))
                )
        self.calls_done = max(self.calls_done, len(calls))
        if not final:
            partial = self.parser.partial_call(section, self.calls_done)
            if partial is not None:
                out.extend(self._send_partial(partial))
        return _coalesce(out)

    def _send_partial(self, partial: PartialCall) -> list[ToolCallDelta]:
        out = []
        if self.open_id is None:
            self.open_id, self.open_sent = random_id("chatcmpl-tool"), ""
            out.append(ToolCallDelta(self.calls_done, "", partial.name, self.open_id))
        if len(partial.arguments) > len(self.open_sent) and partial.arguments.startswith(
            self.open_sent
        ):
            out.append(ToolCallDelta(self.calls_done, partial.arguments[len(self.open_sent) :]))
            self.open_sent = partial.arguments
        return out


def _coalesce(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Joins consecutive pieces of the same call into one."""
    out: list[ToolCallDelta] = []
    for delta in deltas:
        if out and out[-1].index == delta.index and delta.name is None:
            out[-1].arguments += delta.arguments
        else:
            out.append(delta)
    return out
