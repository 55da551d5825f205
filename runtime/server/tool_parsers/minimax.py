"""MiniMax-M2 format: calls as ``<invoke>`` elements inside ``<minimax:tool_call>``:

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    <invoke name="...">...</invoke>
    </minimax:tool_call>

Parameter values are text, converted to the type the tool's JSON schema declares (strings stay as
they are, anything else is read as JSON).
"""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    TaggedToolParser,
    typed_arguments,
)

# The name is quoted in MiniMax's template; tolerate it bare.
NAME = re.compile(r'\s*"?([^">\n]+?)"?\s*>')
PARAMETER = re.compile(r'<parameter name="?([^">\n]+?)"?\s*>(.*?)</parameter>', re.DOTALL)


class MiniMaxM2ToolParser(TaggedToolParser):
    name = "minimax_m2"
    markers = ("<minimax:tool_call>",)
    # Each call is one <invoke> element; the section may hold several.
    call_open, call_close = "<invoke name=", "</invoke>"
    requires_close = True

    def _arguments(self, name: str, body: str) -> str:
        return typed_arguments(self.tools, name, PARAMETER.findall(body))

    def parse_block(self, body: str) -> FunctionCall | None:
        head = NAME.match(body)
        if head is None:
            return None
        name = head.group(1)
        return FunctionCall(name=name, arguments=self._arguments(name, body[head.end() :]))

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        """Arguments grow a parameter at a time (as Qwen3-Coder's do)."""
        block = self.open_block(section, complete)
        head = None if block is None else NAME.match(block)
        if block is None or head is None:
            return None
        name = head.group(1)
        return PartialCall(name, self._arguments(name, block[head.end() :])[:-1])
