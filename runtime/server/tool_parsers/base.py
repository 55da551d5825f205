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

import contextlib
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


def _list_items(body: str) -> tuple[list[tuple[Any, str]], str, bool]:
    """A JSON list read item by item, so calls show as soon as each object closes:
    ``(items with their text, the unparsed rest, whether the list was a list)``."""
    stripped = body.lstrip()
    if not stripped.startswith("["):
        values, rest = decode_json_spans(body)  # a bare object (or several) also occurs
        return values, rest, False
    values, rest = decode_json_spans(stripped[1:])
    return values, rest, True


def parse_call_list(body: str, final: bool) -> list[FunctionCall] | None:
    """The calls of a JSON list of ``{"name", "arguments"}`` objects (Mistral v3, Granite), as
    ``ToolParser.parse_section`` returns them."""
    items, rest, in_list = _list_items(body)
    calls: list[FunctionCall] = []
    for value, raw in items:
        for item in value if isinstance(value, list) else [value]:
            call = call_from_dict(item, raw=raw if item is value else None)
            if call is None:
                return None if final else calls
            calls.append(call)
    closing = rest.strip()
    if final and (not calls or (closing != "]" if in_list else closing)):
        return None
    return calls


def partial_call_in_list(body: str, complete: int) -> PartialCall | None:
    """The call being written after the first ``complete`` of a list ``parse_call_list`` reads."""
    items, rest, _ = _list_items(body)
    if len(items) != complete or not rest or rest.lstrip().startswith("]"):
        return None
    return partial_from_object_text(rest)


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def parameter_type(tools: list[ChatTool], function: str, parameter: str) -> str | None:
    """The JSON schema type ``function``'s tool declares for ``parameter``, if any."""
    for tool in tools:
        if tool.function.name == function:
            props = (tool.function.parameters or {}).get("properties", {})
            spec = props.get(parameter, {})
            kind = spec.get("type") if isinstance(spec, dict) else None
            return kind if isinstance(kind, str) else None
    return None


def typed_arguments(
    tools: list[ChatTool], function: str, pairs: list[tuple[str, str]], strip: str = "\n"
) -> str:
    """The JSON arguments of a call whose parameters are written as text (the XML formats):
    a string-typed parameter stays text (less ``strip`` around it), any other is read as JSON
    where it parses."""
    arguments: dict[str, Any] = {}
    for key, raw in pairs:
        name = key.strip()
        arguments[name] = raw.strip(strip)
        if parameter_type(tools, function, name) != "string":
            with contextlib.suppress(json.JSONDecodeError):
                arguments[name] = json.loads(raw)
    return json.dumps(arguments, ensure_ascii=False)


class ToolParser(ABC):
    name: ClassVar[str]
    # Marker strings that may open the tool section; a tail of the output that could still grow
    # into one is held back while streaming.
    markers: ClassVar[tuple[str, ...]] = ()
    # Whether its markers are special tokens, which a request with tools must then keep in the
    # output (vLLM's adjust_request of the same parsers).
    keeps_special_tokens: ClassVar[bool] = False
    # Whether it reads the raw output rather than what a reasoning parser leaves of it (harmony,
    # whose channels carry reasoning, content and calls alike); its content is then the content.
    reads_raw_output: ClassVar[bool] = False

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

    def call_id(self, section: str, index: int) -> str | None:
        """The id the model wrote for call ``index`` (Kimi's ``functions.NAME:0``, which its
        chat template writes back in later turns), once written; None (the default) for a
        random one."""
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
        tool_calls = [
            ToolCall(id=self.call_id(text[start:], index) or random_id("chatcmpl-tool"), function=c)
            for index, c in enumerate(calls)
        ]
        return ExtractedToolCalls(True, tool_calls, content)

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self)


class TaggedToolParser(ToolParser):
    """Calls each in a block between ``call_open`` and ``call_close`` (by default ``<tool_call>``
    and ``</tool_call>``: Hermes' JSON, Qwen3-Coder's XML): the blocks are found here, each read
    by ``parse_block``."""

    markers: ClassVar[tuple[str, ...]] = (TOOL_CALL_OPEN,)
    call_open: ClassVar[str] = TOOL_CALL_OPEN
    call_close: ClassVar[str] = TOOL_CALL_CLOSE
    # Whether a block cut off before ``call_close`` (output truncated) is malformed; where the
    # body alone cannot tell a whole call from a cut one (raw arguments), it must be.
    requires_close: ClassVar[bool] = False

    @abstractmethod
    def parse_block(self, body: str) -> FunctionCall | None:
        """The call in one closed block, or None if it is malformed."""

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        calls: list[FunctionCall] = []
        for block in section.split(self.call_open)[1:]:
            body, closed, _ = block.partition(self.call_close)
            if not closed and not final:
                break
            call = self.parse_block(body) if closed or not self.requires_close else None
            if call is None:
                # A malformed block ends the tool section; with final, it voids it.
                return None if final and not calls else calls
            calls.append(call)
        return calls

    def open_block(self, section: str, complete: int) -> str | None:
        """The text so far of the block after the first ``complete`` ones, while unclosed."""
        blocks = section.split(self.call_open)[1:]
        if len(blocks) <= complete or self.call_close in blocks[complete]:
            return None
        return blocks[complete]

    def open_text(self, text: str, closer: str | None = None) -> str:
        """``text`` less a tail that may be the start of ``closer`` (by default ``call_close``):
        what of a raw value still being written is sure to belong to it."""
        return text[: len(text) - partial_marker_len(text, (closer or self.call_close,))]


class LeadingToolParser(ToolParser):
    """A tool section that can only open the output, with one of ``tags`` or with ``opener``
    (Llama 3's JSON object, the pythonic list, Granite's JSON list)."""

    tags: ClassVar[tuple[str, ...]]
    opener: ClassVar[str]
    # The start of a call after the opener, which plain text does not begin with.
    call_begins: ClassVar[re.Pattern[str]]

    def section_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith((*self.tags, self.opener)):
            return len(text) - len(stripped)
        return None

    def unparsed_is_content(self, section: str, cut: bool) -> bool:
        # The opener ("{", "[") may begin plain text too: cut, it is a call once the tag or
        # the start of a call says so.
        if not cut:
            return True
        stripped = section.lstrip()
        return not stripped.startswith(self.tags) and self.call_begins.match(stripped) is None

    def hold_back(self, text: str) -> int:
        # The section can only open the output: hold leading whitespace and a partial tag.
        stripped = text.lstrip()
        if not stripped or any(tag.startswith(stripped) for tag in self.tags):
            return len(text)
        return 0

    def body(self, section: str) -> str:
        """The section less its tag."""
        body = section.strip()
        for tag in self.tags:
            if body.startswith(tag):
                return body[len(tag) :]
        return body


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
                    ToolCallDelta(index, call.arguments, call.name, self._id(section, index))
                )
        self.calls_done = max(self.calls_done, len(calls))
        if not final:
            partial = self.parser.partial_call(section, self.calls_done)
            if partial is not None:
                out.extend(self._send_partial(section, partial))
        return coalesce(out)

    def _id(self, section: str, index: int) -> str:
        return self.parser.call_id(section, index) or random_id("chatcmpl-tool")

    def _send_partial(self, section: str, partial: PartialCall) -> list[ToolCallDelta]:
        out = []
        if self.open_id is None:
            self.open_id, self.open_sent = self._id(section, self.calls_done), ""
            out.append(ToolCallDelta(self.calls_done, "", partial.name, self.open_id))
        if len(partial.arguments) > len(self.open_sent) and partial.arguments.startswith(
            self.open_sent
        ):
            out.append(ToolCallDelta(self.calls_done, partial.arguments[len(self.open_sent) :]))
            self.open_sent = partial.arguments
        return out


def coalesce(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Joins consecutive pieces of the same call into one."""
    out: list[ToolCallDelta] = []
    for delta in deltas:
        if out and out[-1].index == delta.index and delta.name is None:
            out[-1].arguments += delta.arguments
        else:
            out.append(delta)
    return out
