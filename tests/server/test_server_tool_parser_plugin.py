"""``--tool-parser-plugin``: a Python file that registers a tool-call parser under a name, which
``--tool-call-parser`` then names, as in vLLM; a plugin written against vLLM's classes is refused
with the reason."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from infernetes.runtime.preflight import check_frontend_settings
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.tool_parsers import TOOL_PARSERS, make_tool_parser

PLUGIN = '''
import json

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers import ToolParser, register_tool_parser


@register_tool_parser(["{name}"])
class CallLineParser(ToolParser):
    """Calls written one a line as ``CALL name {{json arguments}}``."""

    markers = ("CALL ",)

    def parse_section(self, section, final):
        calls = []
        for line in section.splitlines():
            name, _, arguments = line.removeprefix("CALL ").partition(" ")
            try:
                json.loads(arguments)
            except ValueError:
                return None if final else calls
            calls.append(FunctionCall(name=name, arguments=arguments))
        return calls
'''


def _settings(plugin: str, parser: str) -> FrontendSettings:
    return FrontendSettings(
        enable_auto_tool_choice=True, tool_call_parser=parser, tool_parser_plugin=plugin
    )


def test_a_plugin_parser_is_named_by_tool_call_parser(tmp_path):
    plugin = tmp_path / "call_line_plugin.py"
    plugin.write_text(PLUGIN.format(name="call_line"))
    with pytest.raises(ValueError, match="'call_line' is unknown"):
        check_frontend_settings(_settings("", "call_line"))
    check_frontend_settings(_settings(str(plugin), "call_line"))
    try:
        args = {"city": "Zürich", "filters": {"days": [1, 2]}}
        text = f"Checking.\nCALL get_weather {json.dumps(args, ensure_ascii=False)}"
        found = make_tool_parser("call_line", None).extract(text)
        assert found.tools_called and found.content == "Checking."
        assert [(c.function.name, json.loads(c.function.arguments)) for c in found.tool_calls] == [
            ("get_weather", args)
        ]
        check_frontend_settings(_settings(str(plugin), "call_line"))  # run once, not again
    finally:
        TOOL_PARSERS.pop("call_line", None)


def test_a_plugin_written_for_vllm_is_refused_with_the_reason(tmp_path):
    plugin = tmp_path / "vllm_plugin.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from vllm.entrypoints.openai.tool_parsers import ToolParser, ToolParserManager

            @ToolParserManager.register_module(["mine"])
            class Mine(ToolParser):
                pass
            """
        )
    )
    with pytest.raises(ValueError, match=r"--tool-parser-plugin .*imports 'vllm'.*not part"):
        check_frontend_settings(_settings(str(plugin), "mine"))


def test_a_missing_plugin_file_and_a_class_of_another_kind_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"--tool-parser-plugin .*no such file"):
        check_frontend_settings(_settings(str(tmp_path / "absent.py"), "hermes"))
    plugin = tmp_path / "not_a_parser.py"
    plugin.write_text(
        "from infernetes.runtime.server.tool_parsers import register_tool_parser\n"
        "@register_tool_parser('odd')\nclass Odd:\n    pass\n"
    )
    with pytest.raises(ValueError, match=r"not a subclass of .*ToolParser"):
        check_frontend_settings(_settings(str(plugin), "odd"))


def test_config_accepts_the_plugin_name_and_refuses_an_unknown_one(tmp_path, capsys):
    from infernetes.cli import main as cli_main

    plugin = tmp_path / "call_line_cli_plugin.py"
    plugin.write_text(PLUGIN.format(name="call_line_cli"))
    argv = ["config", "org/model", "--enable-auto-tool-choice", "--tool-parser-plugin"]
    try:
        assert cli_main.main([*argv, str(plugin), "--tool-call-parser", "call_line_cli"]) == 0
        assert cli_main.main([*argv, str(plugin), "--tool-call-parser", "call_lines"]) != 0
    finally:
        TOOL_PARSERS.pop("call_line_cli", None)
    assert "'call_lines' is unknown" in capsys.readouterr().err


def test_a_server_calls_tools_through_the_plugin_parser(
    tiny_llama_dir, server_process_factory, tmp_path
):
    import openai

    plugin = tmp_path / "call_line_server_plugin.py"
    plugin.write_text(PLUGIN.format(name="call_line_server"))
    args = {"city": "Zürich", "filters": {"days": [1, 2]}}
    text = f"Checking.\nCALL get_weather {json.dumps(args, ensure_ascii=False)}"
    process = server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--enable-auto-tool-choice",
            "--tool-parser-plugin",
            str(plugin),
            "--tool-call-parser",
            "call_line_server",
            "--logits-processors",
            "force_text_processor:ForceText",
        ],
        env={"PYTHONPATH": str(Path(__file__).resolve().parent)},
        log_name="tool-parser-plugin.log",
    )
    with process:
        client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="none", max_retries=0)
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
        choice = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[tool],
            max_tokens=100,
            extra_body={"vllm_xargs": {"force_text": text}},
        ).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == args
