"""Llama 3.1/3.2 JSON format: the whole output is ``{"name": ..., "parameters": {...}}`` (several
separated by ``;``), optionally after the ``<|python_tag|>`` token."""

from __future__ import annotations

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    ToolParser,
    call_from_dict,
    decode_json_values,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def section_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(PYTHON_TAG) or stripped.startswith("{"):
            return len(text) - len(stripped)
        return None

    def hold_back(self, text: str) -> int:
        # The section can only open the output: hold leading whitespace and a partial tag.
        stripped = text.lstrip()
        if not stripped or PYTHON_TAG.startswith(stripped):
            return len(text)
        return 0

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        body = section.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):]
        values, rest = decode_json_values(body)
        calls: list[FunctionCall] = []
        for value in values:
            call = call_from_dict(value, "parameters")
            if call is None:
                return None if final else calls
            calls.append(call)
        if final and rest.strip():
            return None
        return calls
