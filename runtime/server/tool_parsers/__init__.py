"""Tool-call parsers, chosen by ``--tool-call-parser``."""

from __future__ import annotations

from infernetes.runtime.server.protocol import ChatTool
from infernetes.runtime.server.tool_parsers.base import (
    ExtractedToolCalls,
    StreamDelta,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
)
from infernetes.runtime.server.tool_parsers.hermes import HermesToolParser
from infernetes.runtime.server.tool_parsers.llama3_json import Llama3JsonToolParser
from infernetes.runtime.server.tool_parsers.mistral import MistralToolParser
from infernetes.runtime.server.tool_parsers.pythonic import PythonicToolParser
from infernetes.runtime.server.tool_parsers.qwen import QwenToolParser
from infernetes.runtime.server.tool_parsers.required import RequiredCallsParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    # llama4_json is the same JSON shape as Llama 3's.
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
    "qwen": QwenToolParser,
    "qwen3_coder": QwenToolParser,
}

# Parser names vLLM knows that are not implemented here: refused with a clear message.
KNOWN_UNSUPPORTED = (
    "deepseek_v3",
    "granite-20b-fc",
    "granite",
    "internlm",
    "jamba",
    "phi4_mini_json",
)


def check_tool_parser_name(name: str) -> None:
    """Raises ValueError naming the supported parsers unless ``name`` is one of them."""
    if name in TOOL_PARSERS:
        return
    supported = ", ".join(sorted(TOOL_PARSERS))
    if name in KNOWN_UNSUPPORTED:
        raise ValueError(
            f"--tool-call-parser {name!r} is not supported yet; supported: {supported}"
        )
    raise ValueError(f"--tool-call-parser {name!r} is unknown; supported: {supported}")


def make_tool_parser(name: str, tools: list[ChatTool] | None) -> ToolParser:
    check_tool_parser_name(name)
    return TOOL_PARSERS[name](tools)


__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCalls",
    "RequiredCallsParser",
    "StreamDelta",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "check_tool_parser_name",
    "make_tool_parser",
]
