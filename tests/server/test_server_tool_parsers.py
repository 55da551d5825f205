"""Tool-call parsers: whole outputs and the same outputs streamed a character at a time."""

from __future__ import annotations

import json

import pytest
from infernetes.runtime.server.protocol import ChatTool
from infernetes.runtime.server.tool_parsers import (
    TOOL_PARSERS,
    check_tool_parser_name,
    make_tool_parser,
)

WEATHER = ChatTool.model_validate({"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "days": {"type": "integer"}}},
}})

CASES = {
    "hermes": (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
        "Let me check.",
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        None,
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        None,
    ),
    "pythonic": ("[get_weather(city='Paris', days=2), get_weather(city=\"Oslo\")]", None),
    "qwen": (
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
        "Sure.",
    ),
}
EXPECTED = [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Oslo"})]


def _calls(tool_calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


@pytest.mark.parametrize("name", sorted(CASES))
def test_extracts_calls_and_content(name):
    text, content = CASES[name]
    result = make_tool_parser(name, [WEATHER]).extract(text)
    assert result.tools_called
    assert _calls(result.tool_calls) == EXPECTED
    assert result.content == content


@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_matches_whole(name):
    text, content = CASES[name]
    stream = make_tool_parser(name, [WEATHER]).stream()
    streamed_content = ""
    calls = []
    for char in text:
        delta = stream.feed(char)
        streamed_content += delta.content
        calls += delta.tool_calls
    final = stream.finish()
    streamed_content += final.content
    calls += final.tool_calls
    assert [i for i, _ in calls] == [0, 1]
    assert _calls([c for _, c in calls]) == EXPECTED
    assert streamed_content.strip() == (content or "")


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_is_content(name):
    parser = make_tool_parser(name, [WEATHER])
    text = "The weather in Paris is mild; no tools needed."
    result = parser.extract(text)
    assert not result.tools_called and result.content == text
    stream = parser.stream()
    out = "".join(stream.feed(c).content for c in text) + stream.finish().content
    assert out == text and not stream.tools_called


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral", "pythonic"])
def test_malformed_calls_stay_content(name):
    broken = {"hermes": "<tool_call>{not json</tool_call>", "llama3_json": '{"name": 3}',
              "mistral": "[TOOL_CALLS][{oops", "pythonic": "[get_weather(city=)]"}[name]
    result = make_tool_parser(name, [WEATHER]).extract(broken)
    assert not result.tools_called and result.content == broken


def test_unsupported_parsers_are_refused_by_name():
    with pytest.raises(ValueError, match="not supported yet"):
        check_tool_parser_name("granite")
    with pytest.raises(ValueError, match="unknown"):
        check_tool_parser_name("nope")
    for name in ("hermes", "llama3_json", "mistral", "pythonic", "qwen"):
        assert name in TOOL_PARSERS


def test_mistral_name_args_format():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'
    assert _calls(make_tool_parser("mistral", [WEATHER]).extract(text).tool_calls) == EXPECTED


def test_qwen_keeps_string_typed_values_as_text():
    tool = ChatTool.model_validate({"type": "function", "function": {
        "name": "echo", "parameters": {"properties": {"text": {"type": "string"}}}}})
    text = "<tool_call><function=echo><parameter=text>\n123\n</parameter></function></tool_call>"
    calls = make_tool_parser("qwen", [tool]).extract(text).tool_calls
    assert json.loads(calls[0].function.arguments) == {"text": "123"}
