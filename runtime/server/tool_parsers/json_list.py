"""JSON lists of ``{"name", "arguments"}`` objects after a tag, with content before them:

- ``jamba`` (AI21 Jamba 1.5+): ``<tool_calls>[...]</tool_calls>``, and MiniMax-M1's objects
  one per line between the same tags;
- ``phi4_mini_json`` (Phi-4-mini): ``functools[...]`` (``parameters`` also read for
  ``arguments``).
"""

from __future__ import annotations

from typing import ClassVar

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    ToolParser,
    parse_call_list,
    partial_call_in_list,
)


class TaggedListToolParser(ToolParser):
    tag: ClassVar[str]
    close: ClassVar[str] = ""  # the tag after the list, if the format has one

    def _body(self, section: str) -> str:
        body = section[len(self.tag) :]
        return body.partition(self.close)[0] if self.close else body

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        return parse_call_list(self._body(section), final)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        return partial_call_in_list(self._body(section), complete)


class JambaToolParser(TaggedListToolParser):
    name = "jamba"
    tag, close = "<tool_calls>", "</tool_calls>"
    markers = (tag,)


class Phi4MiniJsonToolParser(TaggedListToolParser):
    name = "phi4_mini_json"
    tag = "functools"
    # "functools" alone is an ordinary word; the list must follow it.
    markers = ("functools[",)
