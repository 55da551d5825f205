"""tool_choice "required": the whole output is a JSON list of ``{"name", "parameters"}`` objects,
constrained to that shape by a grammar, so it is read as one tool section from its first character
and streamed call by call like any parser's (header, then the ``parameters`` text in pieces).

Not a ``--tool-call-parser``: the chat server uses it whenever a request says ``required``.
"""

from __future__ import annotations

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    ToolParser,
    call_from_dict,
    decode_json_spans,
    partial_from_object_text,
)


def _list_body(section: str) -> str | None:
    """The text after the list's ``[``, None before the model has written it."""
    stripped = section.lstrip()
    return stripped[1:] if stripped.startswith("[") else None


class RequiredCallsParser(ToolParser):
    name = "required"

    def section_start(self, text: str) -> int | None:
        return 0

    def unparsed_is_content(self, section: str, cut: bool) -> bool:
        return False  # the output can only be calls, however it ends

    def hold_back(self, text: str) -> int:
        return len(text)

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        """The calls whose objects are closed, whether or not the list is: the grammar allows
        nothing else, so a list cut short holds the calls written before the cut."""
        body = _list_body(section)
        if body is None:
            return None if final else []
        calls: list[FunctionCall] = []
        for value, raw in decode_json_spans(body)[0]:
            call = call_from_dict(value, "parameters", raw=raw)
            if call is None:
                break
            calls.append(call)
        return calls

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        body = _list_body(section)
        if body is None:
            return None
        values, rest = decode_json_spans(body)
        if len(values) != complete or not rest or rest.startswith("]"):
            return None
        return partial_from_object_text(rest)
