"""Qwen3-Coder XML format: each call is

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Seed-OSS writes the same calls between ``<seed:tool_call>`` and ``</seed:tool_call>``.

Parameter values are text; they are converted to the type the tool's JSON schema declares
(numbers, booleans, objects and arrays are read as JSON), strings stay as they are.
"""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    TaggedToolParser,
    typed_arguments,
)

FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
FUNCTION_OPEN = re.compile(r"<function=([^>\n]+)>")
PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class QwenToolParser(TaggedToolParser):
    name = "qwen"

    def parse_block(self, body: str) -> FunctionCall | None:
        match = FUNCTION.search(body)
        if match is None:
            return None
        name = match.group(1).strip()
        return FunctionCall(name=name, arguments=self._arguments(name, match.group(2)))

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        """Arguments grow a parameter at a time: the JSON object of the parameters closed so
        far, without its closing brace (the whole call's arguments begin with exactly that)."""
        block = self.open_block(section, complete)
        head = None if block is None else FUNCTION_OPEN.search(block)
        if block is None or head is None:
            return None
        name = head.group(1).strip()
        return PartialCall(name, self._arguments(name, block[head.end() :])[:-1])

    def _arguments(self, name: str, body: str) -> str:
        return typed_arguments(self.tools, name, PARAMETER.findall(body))


class SeedOssToolParser(QwenToolParser):
    name = "seed_oss"
    markers = ("<seed:tool_call>",)
    call_open, call_close = "<seed:tool_call>", "</seed:tool_call>"
