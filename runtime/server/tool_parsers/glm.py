"""GLM-4.5/4.6 and GLM-4.7 format: each call in a ``<tool_call>`` block, the function name first,
then each parameter as a key and a value:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

(GLM-4.7 writes the same without the newlines.) Values are text; a string-typed parameter is
kept verbatim (whitespace can be its content), any other is read as JSON.
"""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    TaggedToolParser,
    typed_arguments,
)

ARG_KEY = "<arg_key>"
# The name ends at the first new line or parameter, whichever comes first.
HEAD = re.compile(r"\s*([^\n<]+?)\s*(?:\n|(?=<arg_key>))")
PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm45ToolParser(TaggedToolParser):
    name = "glm45"
    requires_close = True

    def _arguments(self, name: str, body: str) -> str:
        return typed_arguments(self.tools, name, PAIR.findall(body), strip="")

    def parse_block(self, body: str) -> FunctionCall | None:
        head = HEAD.match(body + "\n")  # a call without parameters ends at the block's end
        if head is None or (body[head.end() :].strip() and ARG_KEY not in body):
            return None
        name = head.group(1)
        return FunctionCall(name=name, arguments=self._arguments(name, body[head.end() :]))

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        """Arguments grow a parameter at a time (as Qwen3-Coder's do)."""
        block = self.open_block(section, complete)
        head = None if block is None else HEAD.match(block)
        if block is None or head is None:
            return None
        name = head.group(1)
        return PartialCall(name, self._arguments(name, block[head.end() :])[:-1])
