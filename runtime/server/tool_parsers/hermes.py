"""Hermes format (NousResearch Hermes 2/3, Qwen2.5, Qwen3): one JSON object per call inside
``<tool_call>...</tool_call>`` tags, after optional content."""

from __future__ import annotations

import json

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    ToolParser,
    call_from_dict,
    partial_from_object_text,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"
    markers = (OPEN,)

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        calls: list[FunctionCall] = []
        for block in section.split(OPEN)[1:]:
            body, closed, _ = block.partition(CLOSE)
            if not closed and not final:
                break
            try:
                call = call_from_dict(json.loads(body), raw=body)
            except json.JSONDecodeError:
                call = None
            if call is None:
                # A malformed block ends the tool section; with final, it voids it.
                return None if final and not calls else calls
            calls.append(call)
        return calls

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        blocks = section.split(OPEN)[1:]
        if len(blocks) <= complete or CLOSE in blocks[complete]:
            return None
        return partial_from_object_text(blocks[complete])
