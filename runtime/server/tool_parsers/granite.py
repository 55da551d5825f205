"""Granite 3.x format: the output is a JSON list of ``{"name", "arguments"}`` objects, after the
``<|tool_call|>`` token (Granite 3.0) or the ``<tool_call>`` text (Granite 3.1), or bare."""

from __future__ import annotations

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    LeadingToolParser,
    PartialCall,
    parse_call_list,
    partial_call_in_list,
)


class GraniteToolParser(LeadingToolParser):
    name = "granite"
    tags, opener = ("<|tool_call|>", "<tool_call>"), "["

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        return parse_call_list(self.body(section), final)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        return partial_call_in_list(self.body(section), complete)
