"""Hermes format (NousResearch Hermes 2/3, Qwen2.5, Qwen3): one JSON object per call inside
``<tool_call>...</tool_call>`` tags, after optional content; InternLM2's between its action
tokens."""

from __future__ import annotations

import json

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    TaggedToolParser,
    call_from_dict,
    partial_from_object_text,
)


class HermesToolParser(TaggedToolParser):
    name = "hermes"

    def parse_block(self, body: str) -> FunctionCall | None:
        try:
            return call_from_dict(json.loads(body), raw=body)
        except json.JSONDecodeError:
            return None

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        block = self.open_block(section, complete)
        return None if block is None else partial_from_object_text(block)


class InternLM2ToolParser(HermesToolParser):
    """InternLM2/2.5: the same JSON object (``parameters`` or ``arguments``) between
    ``<|action_start|><|plugin|>`` and ``<|action_end|>``."""

    name = "internlm"
    markers = ("<|action_start|><|plugin|>",)
    call_open, call_close = "<|action_start|><|plugin|>", "<|action_end|>"
