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

WEATHER = ChatTool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
)

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


# Every parser follows a call while it is written and sends its arguments in pieces.
INCREMENTAL = set(CASES)


def _stream_pieces(name: str, text: str, size: int):
    """Feeds ``text`` ``size`` characters at a time: (content, pieces, stream)."""
    stream = make_tool_parser(name, [WEATHER]).stream()
    content = ""
    pieces = []
    for at in range(0, len(text), size):
        delta = stream.feed(text[at : at + size])
        content += delta.content
        pieces += delta.tool_calls
    final = stream.finish()
    return content + final.content, pieces + final.tool_calls, stream


@pytest.mark.parametrize("size", [1, 3, 8])
@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_matches_whole(name, size):
    """The streamed pieces of each call join up to exactly the whole result's arguments."""
    text, content = CASES[name]
    whole = make_tool_parser(name, [WEATHER]).extract(text).tool_calls
    streamed_content, pieces, stream = _stream_pieces(name, text, size)
    headers = [p for p in pieces if p.name is not None]
    assert [(p.index, p.name) for p in headers] == [(0, "get_weather"), (1, "get_weather")]
    assert len({p.id for p in headers}) == 2 and all(p.id for p in headers)
    joined = ["".join(p.arguments for p in pieces if p.index == i) for i in (0, 1)]
    assert joined == [c.function.arguments for c in whole]
    assert _calls(whole) == EXPECTED
    assert streamed_content.strip() == (content or "")
    assert stream.calls_sent == 2
    # The header of a call comes before any of its pieces, and calls do not interleave.
    assert [p.index for p in pieces] == sorted(p.index for p in pieces)
    assert pieces[0].name is not None


@pytest.mark.parametrize("name", sorted(INCREMENTAL))
def test_streaming_sends_arguments_as_they_are_written(name):
    """Fed a character at a time, the first call's arguments arrive in several pieces, and the
    first pieces are out before the call (or the section) is complete."""
    text, _ = CASES[name]
    _, pieces, _ = _stream_pieces(name, text, 1)
    first_call = [p for p in pieces if p.index == 0 and p.arguments]
    assert len(first_call) > 3, first_call
    whole = make_tool_parser(name, [WEATHER]).extract(text).tool_calls[0].function.arguments
    assert first_call[0].arguments != whole


def test_mistral_name_args_format_streams_in_pieces():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'
    whole = make_tool_parser("mistral", [WEATHER]).extract(text).tool_calls
    _, pieces, _ = _stream_pieces("mistral", text, 2)
    assert [p.name for p in pieces if p.name] == ["get_weather", "get_weather"]
    assert ["".join(p.arguments for p in pieces if p.index == i) for i in (0, 1)] == [
        c.function.arguments for c in whole
    ]
    assert len([p for p in pieces if p.index == 0 and p.arguments]) > 3


@pytest.mark.parametrize("size", [1, 2, 5])
def test_pythonic_streams_a_long_string_argument_in_pieces(size):
    """A long string value (with quotes, escapes and non-ASCII text) goes out while it is
    written; the pieces join up to exactly the final JSON arguments."""
    note = r"It's \"quoted\", a tab\t, a new line\n and \u00e9t\xe9 café " * 4
    text = f"[get_weather(city='Paris', note=\"{note}\", days=2), get_weather(city='Oslo')]"
    whole = make_tool_parser("pythonic", [WEATHER]).extract(text).tool_calls
    assert json.loads(whole[0].function.arguments)["note"].startswith('It\'s "quoted", a tab\t, ')
    _, pieces, _ = _stream_pieces("pythonic", text, size)
    first = [p.arguments for p in pieces if p.index == 0]
    assert "".join(first) == whole[0].function.arguments
    assert "".join(p.arguments for p in pieces if p.index == 1) == whole[1].function.arguments
    # The note alone arrives in many pieces, each out before the call is complete.
    note_pieces = [a for a in first if a and '"note"' not in a and "days" not in a]
    assert len(note_pieces) > 5, first


def test_streaming_wire_format():
    text, _ = CASES["hermes"]
    _, pieces, _ = _stream_pieces("hermes", text, 4)
    header, piece = pieces[0].wire(), next(p for p in pieces if p.name is None).wire()
    assert header["type"] == "function" and header["id"].startswith("chatcmpl-tool")
    assert header["function"]["name"] == "get_weather" and "arguments" in header["function"]
    assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}


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
    broken = {
        "hermes": "<tool_call>{not json</tool_call>",
        "llama3_json": '{"name": 3}',
        "mistral": "[TOOL_CALLS][{oops",
        "pythonic": "[get_weather(city=)]",
    }[name]
    result = make_tool_parser(name, [WEATHER]).extract(broken)
    assert not result.tools_called and result.content == broken


def test_unknown_parsers_are_refused_by_name():
    with pytest.raises(ValueError, match=r"'nope' is unknown; supported: .*hermes"):
        check_tool_parser_name("nope")
    for name in ("hermes", "llama3_json", "mistral", "openai", "pythonic", "qwen"):
        assert name in TOOL_PARSERS


def test_mistral_name_args_format():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'
    assert _calls(make_tool_parser("mistral", [WEATHER]).extract(text).tool_calls) == EXPECTED


def test_mistral_call_ids_written_by_the_model_are_kept():
    text = (
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris", "days": 2}'
        '[TOOL_CALLS]get_weather[CALL_ID]Z9y8X7w6v[ARGS]{"city": "Oslo"}'
    )
    calls = make_tool_parser("mistral", [WEATHER]).extract(text).tool_calls
    assert _calls(calls) == EXPECTED
    assert [c.id for c in calls] == ["a1B2c3D4e", "Z9y8X7w6v"]
    _, pieces, _ = _stream_pieces("mistral", text, 3)
    assert [(p.name, p.id) for p in pieces if p.name] == [
        ("get_weather", "a1B2c3D4e"),
        ("get_weather", "Z9y8X7w6v"),
    ]


def test_qwen_keeps_string_typed_values_as_text():
    tool = ChatTool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "echo",
                "parameters": {"properties": {"text": {"type": "string"}}},
            },
        }
    )
    text = "<tool_call><function=echo><parameter=text>\n123\n</parameter></function></tool_call>"
    calls = make_tool_parser("qwen", [tool]).extract(text).tool_calls
    assert json.loads(calls[0].function.arguments) == {"text": "123"}
