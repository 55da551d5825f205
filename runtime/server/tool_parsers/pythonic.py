"""Pythonic format (Llama 3.2/4, ToolACE): the output is a Python list of calls with keyword
arguments, ``[get_weather(city='Paris'), get_time(zone="CET")]``, parsed with ``ast``.

While streaming, the call being written is followed keyword by keyword, and a string value
character by character: its arguments so far are the JSON of the keywords complete so far (plus
the string written so far) without the closing characters, which the whole call's arguments
begin with, since JSON escapes each character on its own.
"""

from __future__ import annotations

import ast
import json
import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import LeadingToolParser, PartialCall

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
CALL_NAME = re.compile(r"\s*([A-Za-z_]\w*)\s*\(")
# A keyword whose value is a plain quoted string being written (not triple-quoted, no prefix).
STRING_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*(['\"])(?!\2\2)")
# The longest escape that may be cut mid-way (``\U0001F600``).
LONGEST_ESCAPE = 10


JSON_NAMES = {"true": True, "false": False, "null": None}


class _JsonNames(ast.NodeTransformer):
    # Olmo 3 writes JSON's true, false and null among the Python literals.
    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in JSON_NAMES:
            return ast.copy_location(ast.Constant(JSON_NAMES[node.id]), node)
        return node


def _literal(node: ast.expr) -> object:
    return ast.literal_eval(_JsonNames().visit(node))


def split_top_level(text: str) -> tuple[list[str], bool]:
    """``text`` split at its commas outside brackets and strings, up to the bracket that closes
    the enclosing one: (parts, closed). The last part of an unclosed text is still growing."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    escaped = False
    start = 0
    for pos, char in enumerate(text):
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                parts.append(text[start:pos])
                return parts, True
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:pos])
            start = pos + 1
    parts.append(text[start:])
    return parts, False


def _open_string(source: str, quote: str) -> str | None:
    """The value of a string literal whose opening ``quote`` is behind and whose closing one is
    not written yet; an escape cut mid-way is left out. None if it cannot be read."""
    for cut in range(min(LONGEST_ESCAPE, len(source)) + 1):
        try:
            value = ast.literal_eval(quote + source[: len(source) - cut] + quote)
        except (ValueError, SyntaxError):
            continue
        return value if isinstance(value, str) else None
    return None


class PythonicToolParser(LeadingToolParser):
    name = "pythonic"
    tags, opener = (PYTHON_START,), "["
    call_begins = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")

    @staticmethod
    def _body(section: str) -> str:
        return section.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        body = self._body(section)
        try:
            tree = ast.parse(body, mode="eval")
        except SyntaxError:
            # Incomplete while streaming: the calls complete so far are those of the list
            # with the call being written cut off.
            return None if final else self._complete_calls(body)
        if not isinstance(tree.body, ast.List):
            return None if final else []
        calls: list[FunctionCall] = []
        for element in tree.body.elts:
            call = self._call(element)
            if call is None:
                return None if final else []
            calls.append(call)
        return calls

    @staticmethod
    def _call(element: ast.expr) -> FunctionCall | None:
        if not (isinstance(element, ast.Call) and isinstance(element.func, ast.Name)):
            return None
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in element.keywords if kw.arg}
        except (ValueError, SyntaxError):
            return None
        if element.args or len(arguments) != len(element.keywords):
            return None
        return FunctionCall(
            name=element.func.id, arguments=json.dumps(arguments, ensure_ascii=False)
        )

    def _complete_calls(self, body: str) -> list[FunctionCall]:
        if not body.startswith("["):
            return []
        elements, _ = split_top_level(body[1:])
        calls: list[FunctionCall] = []
        for element in elements[:-1]:  # the last one is still being written
            try:
                call = self._call(ast.parse(element.strip(), mode="eval").body)
            except SyntaxError:
                return calls
            if call is None:
                return calls
            calls.append(call)
        return calls

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        body = self._body(section)
        if not body.startswith("["):
            return None
        elements, closed = split_top_level(body[1:])
        if closed or len(elements) != complete + 1:
            return None
        head = CALL_NAME.match(elements[complete])
        if head is None:
            return None
        keywords, call_closed = split_top_level(elements[complete][head.end() :])
        if call_closed:
            return None  # complete: it goes out whole with the next parse
        try:
            done = ast.parse(f"f({','.join(keywords[:-1])})", mode="eval").body
        except SyntaxError:
            return None
        if (
            not isinstance(done, ast.Call)
            or done.args
            or any(kw.arg is None for kw in done.keywords)
        ):
            return None
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in done.keywords}
        except (ValueError, SyntaxError):
            return None
        writing = STRING_KEYWORD.match(keywords[-1])
        if writing is not None and writing.group(1) not in arguments:
            value = _open_string(keywords[-1][writing.end() :], writing.group(2))
            if value is not None:
                # Without the closing quote and brace: '{"city": "Par'.
                arguments[writing.group(1)] = value
                return PartialCall(head.group(1), json.dumps(arguments, ensure_ascii=False)[:-2])
        return PartialCall(head.group(1), json.dumps(arguments, ensure_ascii=False)[:-1])


FUNCTION_CALLS_OPEN, FUNCTION_CALLS_CLOSE = "<function_calls>", "</function_calls>"


class Olmo3ToolParser(PythonicToolParser):
    """Olmo 3: the calls one per line between ``<function_calls>`` and ``</function_calls>``,
    read as the pythonic list of those lines."""

    name = "olmo3"
    tags, opener = (FUNCTION_CALLS_OPEN,), FUNCTION_CALLS_OPEN

    @staticmethod
    def _body(section: str) -> str:
        inner, closed, _ = (
            section.strip().removeprefix(FUNCTION_CALLS_OPEN).partition(FUNCTION_CALLS_CLOSE)
        )
        calls = ", ".join(line.strip() for line in inner.splitlines() if line.strip())
        return f"[{calls}]" if closed else f"[{calls}"

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        # The closing tag may be left out at the end of the output.
        if final and FUNCTION_CALLS_CLOSE not in section:
            section += FUNCTION_CALLS_CLOSE
        return super().parse_section(section, final)
