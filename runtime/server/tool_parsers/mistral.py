"""Mistral format: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` (v3 tokenizers),
or ``[TOOL_CALLS]name[ARGS]{...}`` repeated (v11+ tokenizers), the name maybe followed by
``[CALL_ID]id`` (as mistral_common writes a call back into the conversation)."""

from __future__ import annotations

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    ToolParser,
    arguments_json,
    decode_json_spans,
    parse_call_list,
    partial_call_in_list,
    scan_json_value,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _name_and_id(head: str) -> tuple[str, str | None]:
    """``name`` or ``name[CALL_ID]id``, before a call's ``[ARGS]``."""
    name, found, call_id = head.partition(CALL_ID)
    return name.strip(), (call_id.strip() or None) if found else None


class MistralToolParser(ToolParser):
    name = "mistral"
    markers = (TOOL_CALLS,)
    # [TOOL_CALLS] and [ARGS] are special tokens of Mistral's tokenizers (vLLM's adjust_request)
    keeps_special_tokens = True

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        body = section[len(TOOL_CALLS) :]
        if ARGS in body:
            return self._parse_name_args(body, final)
        return parse_call_list(body, final)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        body = section[len(TOOL_CALLS) :]
        if ARGS in body:
            chunks = body.split(TOOL_CALLS)
            if len(chunks) != complete + 1:
                return None
            head, found, args = chunks[-1].partition(ARGS)
            name, _ = _name_and_id(head)
            start = len(args) - len(args.lstrip())
            if not found or not name or (start < len(args) and args[start] != "{"):
                return None
            end, _ = scan_json_value(args, start)
            return PartialCall(name, args[start:end])
        return partial_call_in_list(body, complete)

    def call_id(self, section: str, index: int) -> str | None:
        chunks = section[len(TOOL_CALLS) :].split(TOOL_CALLS)
        if ARGS not in section or index >= len(chunks) or ARGS not in chunks[index]:
            return None
        return _name_and_id(chunks[index].partition(ARGS)[0])[1]

    @staticmethod
    def _parse_name_args(body: str, final: bool) -> list[FunctionCall] | None:
        calls: list[FunctionCall] = []
        for chunk in body.split(TOOL_CALLS):
            head, found, args = chunk.partition(ARGS)
            name, _ = _name_and_id(head)
            if not found or not name:
                return None if final else calls
            text = args.lstrip()
            end, complete = scan_json_value(text) if text.startswith("{") else (0, False)
            values = decode_json_spans(text[:end])[0] if complete else []
            if not values:
                return None if final else calls
            if final and text[end:].strip():
                return None
            value, raw = values[0]
            calls.append(
                FunctionCall(
                    name=name,
                    arguments=raw if isinstance(value, dict) else arguments_json(value),
                )
            )
        return calls
