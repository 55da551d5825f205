"""Tool-call parsers, chosen by ``--tool-call-parser``; ``--tool-parser-plugin`` adds more.

A plugin is a Python file, run once at startup as vLLM runs one, that registers its parsers by
name with this module's ``register_tool_parser`` (vLLM's ``ToolParserManager.register_module``)
on a subclass of this module's ``ToolParser``. Plugins written against vLLM's own classes import
``vllm``, which is not part of this server: they are refused with that reason.
"""

from __future__ import annotations

from collections.abc import Callable

from infernetes.runtime.qualified_import import import_file
from infernetes.runtime.server.protocol import ChatTool
from infernetes.runtime.server.tool_parsers.base import (
    ExtractedToolCalls,
    StreamDelta,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
)
from infernetes.runtime.server.tool_parsers.deepseek import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
)
from infernetes.runtime.server.tool_parsers.gigachat import GigaChat3ToolParser
from infernetes.runtime.server.tool_parsers.glm import Glm45ToolParser
from infernetes.runtime.server.tool_parsers.granite import (
    Granite20bFCToolParser,
    GraniteToolParser,
)
from infernetes.runtime.server.tool_parsers.hermes import HermesToolParser, InternLM2ToolParser
from infernetes.runtime.server.tool_parsers.json_list import (
    JambaToolParser,
    Phi4MiniJsonToolParser,
)
from infernetes.runtime.server.tool_parsers.kimi import KimiK2ToolParser
from infernetes.runtime.server.tool_parsers.llama3_json import Llama3JsonToolParser
from infernetes.runtime.server.tool_parsers.minimax import MiniMaxM2ToolParser
from infernetes.runtime.server.tool_parsers.mistral import MistralToolParser
from infernetes.runtime.server.tool_parsers.openai import OpenAIToolParser
from infernetes.runtime.server.tool_parsers.pythonic import Olmo3ToolParser, PythonicToolParser
from infernetes.runtime.server.tool_parsers.qwen import QwenToolParser, SeedOssToolParser
from infernetes.runtime.server.tool_parsers.required import RequiredCallsParser
from infernetes.runtime.server.tool_parsers.xlam import XLamToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "gigachat3": GigaChat3ToolParser,
    # GLM-4.7 writes GLM-4.5's format without the new lines.
    "glm45": Glm45ToolParser,
    "glm47": Glm45ToolParser,
    "granite": GraniteToolParser,
    "granite-20b-fc": Granite20bFCToolParser,
    "hermes": HermesToolParser,
    # Hunyuan-A13B writes Jamba's tags and list.
    "hunyuan_a13b": JambaToolParser,
    "internlm": InternLM2ToolParser,
    "jamba": JambaToolParser,
    "kimi_k2": KimiK2ToolParser,
    "llama3_json": Llama3JsonToolParser,
    # llama4_json is the same JSON shape as Llama 3's.
    "llama4_json": Llama3JsonToolParser,
    # Llama 4's pythonic calls come between <|python_start|> and <|python_end|>, which the
    # pythonic parser reads.
    "llama4_pythonic": PythonicToolParser,
    # MiniMax-M1 writes Jamba's tags around one call object per line, which the list reader
    # also takes.
    "minimax_m1": JambaToolParser,
    "minimax_m2": MiniMaxM2ToolParser,
    "mistral": MistralToolParser,
    "olmo3": Olmo3ToolParser,
    # gpt-oss's harmony format.
    "openai": OpenAIToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
    "pythonic": PythonicToolParser,
    "qwen": QwenToolParser,
    "qwen3_coder": QwenToolParser,
    "seed_oss": SeedOssToolParser,
    # Step-3.5 writes Qwen3-Coder's XML calls.
    "step3p5": QwenToolParser,
    "xlam": XLamToolParser,
}


def register_tool_parser(
    names: str | list[str],
) -> Callable[[type[ToolParser]], type[ToolParser]]:
    """Class decorator: registers a ToolParser subclass under each of ``names`` (a plugin's name
    replaces a built-in one of the same name, as in vLLM)."""

    def register(parser: type[ToolParser]) -> type[ToolParser]:
        if not (isinstance(parser, type) and issubclass(parser, ToolParser)):
            raise TypeError(
                f"register_tool_parser: {parser!r} is not a subclass of "
                "infernetes.runtime.server.tool_parsers.ToolParser"
            )
        for name in [names] if isinstance(names, str) else names:
            TOOL_PARSERS[name] = parser
        return parser

    return register


def load_tool_parser_plugin(path: str) -> None:
    """Runs the ``--tool-parser-plugin`` file, whose parsers register themselves."""
    import_file("--tool-parser-plugin", path)


def check_tool_parser_name(name: str) -> None:
    """Raises ValueError naming the supported parsers unless ``name`` is one of them."""
    if name in TOOL_PARSERS:
        return
    supported = ", ".join(sorted(TOOL_PARSERS))
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
    "load_tool_parser_plugin",
    "make_tool_parser",
    "register_tool_parser",
]
