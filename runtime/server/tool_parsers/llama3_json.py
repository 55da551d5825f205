"""Llama 3.1/3.2 JSON format: the whole output is ``{"name": ..., "parameters": {...}}`` (several
separated by ``;``), optionally after the ``<|python_tag|>`` token."""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    LeadingToolParser,
    PartialCall,
    call_from_dict,
    decode_json_spans,
    partial_from_object_text,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(LeadingToolParser):
    name = "llama3_json"
    tags, opener = (PYTHON_TAG,), "{"
    call_begins = re.compile(r'\{\s*"name"\s*:')

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        values, rest = decode_json_spans(self.body(section))
        calls: list[FunctionCall] = []
        for value, raw in values:
            call = call_from_dict(value, "parameters", raw=raw)
            if call is None:
                return None if final else calls
            calls.append(call)
        if final and rest.strip():
            return None
        return calls

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        values, rest = decode_json_spans(self.body(section))
        if len(values) != complete or not rest:
            return None
        return partial_from_object_text(rest)
