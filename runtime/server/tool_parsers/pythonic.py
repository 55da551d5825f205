"""Pythonic format (Llama 3.2/4, ToolACE): the output is a Python list of calls with keyword
arguments, ``[get_weather(city='Paris'), get_time(zone="CET")]``, parsed with ``ast``."""

from __future__ import annotations

import ast
import json

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import ToolParser

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"


def _literal(node: ast.expr) -> object:
    return ast.literal_eval(node)


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def section_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith(PYTHON_START) or stripped.startswith("["):
            return len(text) - len(stripped)
        return None

    def hold_back(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or PYTHON_START.startswith(stripped):
            return len(text)
        return 0

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        body = section.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
        try:
            tree = ast.parse(body, mode="eval")
        except SyntaxError:
            # Incomplete while streaming: the list is emitted once it parses.
            return None if final else []
        if not isinstance(tree.body, ast.List):
            return None if final else []
        calls: list[FunctionCall] = []
        for element in tree.body.elts:
            if not (isinstance(element, ast.Call) and isinstance(element.func, ast.Name)):
                return None if final else []
            try:
                arguments = {kw.arg: _literal(kw.value) for kw in element.keywords if kw.arg}
            except (ValueError, SyntaxError):
                return None if final else []
            if element.args or len(arguments) != len(element.keywords):
                return None if final else []
            calls.append(FunctionCall(name=element.func.id,
                                      arguments=json.dumps(arguments, ensure_ascii=False)))
        return calls
