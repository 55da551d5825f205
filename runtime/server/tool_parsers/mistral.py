"""Mistral format: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (v3 tokenizers),
or ``[TOOL_CALLS]name[ARGS]{...}`` repeated (v11+ tokenizers)."""

from __future__ import annotations

import json

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    ToolParser,
    arguments_json,
    call_from_dict,
    decode_json_values,
)

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralToolParser(ToolParser):
    name = "mistral"
    markers = (TOOL_CALLS,)

    def section_start(self, text: str) -> int | None:
        index = text.find(TOOL_CALLS)
        return None if index < 0 else index

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        body = section[len(TOOL_CALLS):]
        if ARGS in body:
            return self._parse_name_args(body, final)
        values, rest = decode_json_values(body)
        calls: list[FunctionCall] = []
        for value in values:
            for item in value if isinstance(value, list) else [value]:
                call = call_from_dict(item)
                if call is None:
                    return None if final else calls
                calls.append(call)
        if final and (rest.strip() or not calls):
            return None
        return calls

    @staticmethod
    def _parse_name_args(body: str, final: bool) -> list[FunctionCall] | None:
        calls: list[FunctionCall] = []
        decoder = json.JSONDecoder()
        for chunk in body.split(TOOL_CALLS):
            name, found, args = chunk.partition(ARGS)
            if not found or not name.strip():
                return None if final else calls
            try:
                value, end = decoder.raw_decode(args.lstrip())
            except json.JSONDecodeError:
                return None if final else calls
            if final and args.lstrip()[end:].strip():
                return None
            calls.append(FunctionCall(name=name.strip(), arguments=arguments_json(value)))
        return calls
