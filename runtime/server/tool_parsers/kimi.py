"""Kimi K2 format: the calls between ``<|tool_calls_section_begin|>`` and
``<|tool_calls_section_end|>``, each

    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>

The id (``functions.NAME:INDEX``) is the call's id: Kimi's chat template writes it back in later
turns, so it is kept rather than replaced. The arguments are the model's JSON text, as written.
"""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import PartialCall, TaggedToolParser

# Some Kimi checkpoints write the section token in the singular.
SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
CALL_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_ID = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?")


class KimiK2ToolParser(TaggedToolParser):
    name = "kimi_k2"
    markers = SECTION_BEGIN
    call_open, call_close = CALL_BEGIN, CALL_END
    requires_close = True

    @staticmethod
    def _split(body: str) -> tuple[str, str, str] | None:
        """``(id, name, arguments so far)`` once the id is written."""
        call_id, found, args = body.partition(ARGUMENT_BEGIN)
        match = CALL_ID.fullmatch(call_id.strip())
        if not found or match is None:
            return None
        return call_id.strip(), match.group(1), args

    def parse_block(self, body: str) -> FunctionCall | None:
        split = self._split(body)
        return None if split is None else FunctionCall(name=split[1], arguments=split[2].strip())

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        block = self.open_block(section, complete)
        split = None if block is None else self._split(block)
        if split is None:
            return None
        # Whitespace around the arguments is not theirs; a prefix of them ends without it.
        return PartialCall(split[1], self.open_text(split[2].lstrip()).rstrip())

    def call_id(self, section: str, index: int) -> str | None:
        blocks = section.split(CALL_BEGIN)[1:]
        split = self._split(blocks[index]) if index < len(blocks) else None
        return None if split is None else split[0]
