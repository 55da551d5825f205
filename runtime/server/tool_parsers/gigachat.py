"""GigaChat3 format: content, then one call as a JSON object after a call marker,

    Let me check.<|message_sep|>

    function call<|role_sep|>
    {"name": "get_weather", "arguments": {"city": "Paris"}}

or after ``<|function_call|>``. The markers are special tokens, so a request with tools keeps
special tokens in the output (vLLM's parser asks for the same); a ``<|message_sep|>`` ending
the content before the call is not content, nor is a closing ``</s>``.
"""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.text_stream import partial_marker_len
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    ToolParser,
    parse_call_list,
    partial_call_in_list,
)

CALL_MARKERS = ("function call<|role_sep|>\n", "<|function_call|>")
MESSAGE_SEP = "<|message_sep|>"
END_OF_TEXT = "</s>"
CALL_MARKER = re.compile("|".join(re.escape(m) for m in CALL_MARKERS))


class GigaChat3ToolParser(ToolParser):
    name = "gigachat3"
    markers = CALL_MARKERS
    keeps_special_tokens = True

    def section_start(self, text: str) -> int | None:
        start = super().section_start(text)
        if start is None:
            return None
        before = text[:start].rstrip()
        return len(before) - len(MESSAGE_SEP) if before.endswith(MESSAGE_SEP) else start

    def hold_back(self, text: str) -> int:
        # The separator before a call marker is not content: held while a marker may follow.
        sep = text.rfind(MESSAGE_SEP)
        after = text[sep + len(MESSAGE_SEP) :].lstrip()
        if sep >= 0 and any(marker.startswith(after) for marker in CALL_MARKERS):
            return len(text) - sep
        return partial_marker_len(text, (*self.markers, MESSAGE_SEP))

    @staticmethod
    def _body(section: str) -> str:
        marker = CALL_MARKER.search(section)
        body = section[marker.end() :] if marker is not None else ""
        stripped = body.rstrip()
        return stripped[: -len(END_OF_TEXT)] if stripped.endswith(END_OF_TEXT) else body

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        return parse_call_list(self._body(section), final)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        return partial_call_in_list(self._body(section), complete)
