"""Granite formats: ``granite`` (Granite 3.x), the output a JSON list of ``{"name", "arguments"}``
objects after the ``<|tool_call|>`` token (Granite 3.0) or the ``<tool_call>`` text (Granite
3.1), or bare; ``granite-20b-fc``, each call an object after ``<function_call>``."""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    LeadingToolParser,
    PartialCall,
    ToolParser,
    call_from_dict,
    decode_json_spans,
    parse_call_list,
    partial_call_in_list,
    partial_from_object_text,
)


class GraniteToolParser(LeadingToolParser):
    name = "granite"
    tags, opener = ("<|tool_call|>", "<tool_call>"), "["
    call_begins = re.compile(r'\[\s*\{\s*"name"\s*:')

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        return parse_call_list(self.body(section), final)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        return partial_call_in_list(self.body(section), complete)


FUNCTION_CALL = "<function_call>"


class Granite20bFCToolParser(ToolParser):
    """Granite-20B-FunctionCalling: each call a JSON object after ``<function_call>``, after
    optional content."""

    name = "granite-20b-fc"
    markers = (FUNCTION_CALL,)

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        calls: list[FunctionCall] = []
        for chunk in section.split(FUNCTION_CALL)[1:]:
            values, _ = decode_json_spans(chunk)
            call = call_from_dict(values[0][0], raw=values[0][1]) if values else None
            if call is None:
                # Still being written, or malformed (which voids the section when final).
                return None if final else calls
            calls.append(call)
        return calls

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        chunks = section.split(FUNCTION_CALL)[1:]
        if len(chunks) != complete + 1:
            return None
        values, rest = decode_json_spans(chunks[-1])
        return None if values else partial_from_object_text(rest)
