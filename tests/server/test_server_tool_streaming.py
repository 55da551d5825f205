"""tool_choice "required" streams its calls as vLLM does: each call's id and name once its name is
written, then its ``parameters`` text in pieces, call after call with increasing index; a list
cut by max_tokens gives the calls closed before the cut and never raw text as content.

The first half feeds hand-made outputs to the parser, split at every position; the second asks a
real server on the tiny random model, whose output the required-calls grammar keeps well formed.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from infernetes.runtime.server.tool_parsers import RequiredCallsParser, make_tool_parser
from test_server_tool_parsers import CASES as PARSER_CASES
from test_server_tool_parsers import WEATHER

# The grammar allows any JSON whitespace unless --guided-decoding-disable-any-whitespace is set,
# and strings hold any character: brackets and braces inside them must not end a call.
OUTPUTS = {
    "compact": '[{"name":"get_weather","parameters":{"city":"Paris","days":2}},'
    '{"name":"get_weather","parameters":{"city":"Oslo"}}]',
    "spaced": '[\n  {"name": "get_weather", "parameters": {"city": "Paris", "days": 2}} ,\n'
    '  { "name" : "get_weather" , "parameters" : { "city" : "Oslo" } }\n]',
    "tricky strings": '[{"name": "get_weather", "parameters": {"city": "P]a}r\\"i{s, ]", '
    '"days": 2}}, {"name": "get_weather", "parameters": {"city": "Ōslo 🌧 \\u00e9\\n"}}]',
    "nested": '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 2, "extra": '
    '{"hours": [1, 2, {"x": []}], "note": null}}}, '
    '{"name": "get_weather", "parameters": {}}]',
}


def _feed(parser: RequiredCallsParser, pieces: list[str]):
    """(content, tool-call deltas, stream) for the output fed in ``pieces``, then finished."""
    stream = parser.stream()
    content, deltas = "", []
    for piece in pieces:
        delta = stream.feed(piece)
        content += delta.content
        deltas += delta.tool_calls
    final = stream.finish()
    return content + final.content, deltas + final.tool_calls, stream


def _joined(deltas) -> dict[int, tuple[str, str]]:
    """{index: (name, arguments)} as a client joins the streamed pieces."""
    calls: dict[int, tuple[str, str]] = {}
    for delta in deltas:
        name, arguments = calls.get(delta.index, ("", ""))
        calls[delta.index] = (delta.name or name, arguments + delta.arguments)
    return calls


def _whole(text: str) -> list[tuple[str, str]]:
    calls = RequiredCallsParser([WEATHER]).parse_section(text, final=True) or []
    return [(call.name, call.arguments) for call in calls]


def _splits(text: str):
    """The output as one piece, a character at a time, and in two pieces split at each point."""
    yield [text]
    yield list(text)
    for at in range(1, len(text)):
        yield [text[:at], text[at:]]


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_whole_output_gives_each_call_with_its_parameters_text(case):
    text = OUTPUTS[case]
    calls = _whole(text)
    assert [name for name, _ in calls] == ["get_weather", "get_weather"]
    expected = [item["parameters"] for item in json.loads(text)]
    assert [json.loads(arguments) for _, arguments in calls] == expected


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_streamed_pieces_join_up_to_the_whole_calls_at_every_split(case):
    text = OUTPUTS[case]
    whole = _whole(text)
    for pieces in _splits(text):
        content, deltas, stream = _feed(RequiredCallsParser([WEATHER]), pieces)
        assert content == ""
        assert _joined(deltas) == dict(enumerate(whole)), pieces
        headers = [d for d in deltas if d.name is not None]
        assert [d.index for d in headers] == [0, 1]
        assert all(d.id for d in headers) and headers[0].id != headers[1].id
        # A call's header comes first, and the calls do not interleave.
        assert [d.index for d in deltas] == sorted(d.index for d in deltas)
        assert stream.calls_sent == 2


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_arguments_go_out_while_the_call_is_written(case):
    """Fed a character at a time, the header goes out before the parameters are complete and
    the first call's parameters arrive in many pieces."""
    text = OUTPUTS[case]
    stream = RequiredCallsParser([WEATHER]).stream()
    first_arguments = _whole(text)[0][1]
    header_at = None
    pieces = []
    for at, char in enumerate(text):
        for delta in stream.feed(char).tool_calls:
            if delta.index == 0 and delta.name is not None:
                header_at = at
            if delta.index == 0 and delta.arguments:
                pieces.append(delta.arguments)
    assert header_at is not None and header_at < text.index(first_arguments)
    assert len(pieces) > 10 and "".join(pieces) == first_arguments


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_a_cut_output_never_becomes_content(case):
    """Cut at every position (as max_tokens cuts): no content, streamed or whole; the calls
    closed before the cut stream whole, the one being written a prefix of its arguments."""
    text = OUTPUTS[case]
    whole = _whole(text)
    for cut in range(len(text)):
        prefix = text[:cut]
        content, deltas, _ = _feed(RequiredCallsParser([WEATHER]), list(prefix))
        assert content == ""
        closed = _whole(prefix)
        assert closed == whole[: len(closed)]
        streamed = _joined(deltas)
        assert [streamed[i] for i in range(len(closed))] == closed
        for index in set(streamed) - set(range(len(closed))):
            name, arguments = streamed[index]
            assert name == whole[index][0] and whole[index][1].startswith(arguments)


@pytest.mark.parametrize("name", sorted(PARSER_CASES))
def test_auto_calls_cut_by_max_tokens_never_become_content(name):
    """Every --tool-call-parser, its output cut at every position: whole and streamed agree, and
    once the tool section has begun (its marker, or the start of a call after an opener that
    plain text may also begin with), none of it is content."""
    text, _ = PARSER_CASES[name]
    parser = make_tool_parser(name, [WEATHER])
    full = parser.extract(text).tool_calls
    for cut in range(len(text)):
        prefix = text[:cut]
        whole = parser.extract(prefix, cut=True)
        stream = parser.stream()
        content, deltas = "", []
        for char in prefix:
            delta = stream.feed(char)
            content, deltas = content + delta.content, deltas + delta.tool_calls
        final = stream.finish(cut=True)
        content, deltas = content + final.content, deltas + final.tool_calls
        if not whole.tools_called:
            assert content == prefix and not deltas
            continue
        assert content.strip() == (whole.content or "")
        closed = [(c.function.name, c.function.arguments) for c in whole.tool_calls]
        assert closed == [(c.function.name, c.function.arguments) for c in full[: len(closed)]]
        streamed = _joined(deltas)
        assert [streamed[i] for i in range(len(closed))] == closed
        for index in set(streamed) - set(range(len(closed))):
            assert full[index].function.arguments.startswith(streamed[index][1])
    # The marker parsers' sections are calls from the marker on.
    for marker in parser.markers:
        cut = text.index(marker) + len(marker) + 1
        assert parser.extract(text[:cut], cut=True).tools_called


def test_output_before_the_list_opens_holds_no_call():
    parser = RequiredCallsParser([WEATHER])
    assert parser.parse_section("  ", final=False) == []
    assert parser.parse_section("  ", final=True) is None
    assert _feed(parser, [" ", "\n"])[:2] == ("", [])


# ---------------------------------------------------------------- through a real server

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo", "Reykjavik"]},
                "days": {"enum": [1, 2, 3]},
                "units": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days", "units"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["Europe/Paris", "Atlantic/Reykjavik"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
REQUEST = dict(
    model="tiny",
    messages=[{"role": "user", "content": "Weather and time in Paris?"}],
    tools=[WEATHER_TOOL, TIME_TOOL],
    tool_choice="required",
    temperature=0,
)


@pytest.fixture(scope="module")
def client(main_server):
    return openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )


@pytest.fixture(scope="module")
def no_list_end(tiny_llama_dir) -> dict[str, int]:
    """A logit_bias that bans every token holding "]": the list of calls never closes, so the
    model writes call after call until max_tokens cuts it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    banned = [i for i in range(len(tokenizer)) if "]" in tokenizer.decode([i])]
    return {str(i): -100 for i in banned}


def _streamed(chunks) -> tuple[dict[int, tuple[str, str]], list[dict], str]:
    """({index: (name, arguments)} joined, the tool-call deltas, the content) of a stream."""
    calls: dict[int, tuple[str, str]] = {}
    deltas: list[dict] = []
    content = ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                deltas.append(call.model_dump())
                name, arguments = calls.get(call.index, ("", ""))
                function = call.function
                calls[call.index] = (
                    (function.name if function else None) or name,
                    arguments + ((function.arguments if function else None) or ""),
                )
    return calls, deltas, content


def _finish(chunks) -> str | None:
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons.count(None) == len(reasons) - 1  # one chunk finishes the choice
    return reasons[-1]


def test_required_streams_calls_that_join_up_to_the_whole_answer(client):
    whole = client.chat.completions.create(**REQUEST, max_tokens=200)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    expected = {
        i: (c.function.name, c.function.arguments) for i, c in enumerate(choice.message.tool_calls)
    }
    assert expected and all(isinstance(json.loads(a), dict) for _, a in expected.values())

    chunks = list(client.chat.completions.create(**REQUEST, max_tokens=200, stream=True))
    calls, deltas, content = _streamed(chunks)
    assert calls == expected and content == ""
    assert _finish(chunks) == "tool_calls"
    headers = [d for d in deltas if d["id"]]
    assert [h["index"] for h in headers] == list(range(len(expected)))
    assert all(h["type"] == "function" and h["function"]["name"] for h in headers)
    # The arguments arrive in pieces as the model writes them, not in one delta at the end.
    pieces = [d for d in deltas if d["index"] == 0 and d["function"]["arguments"]]
    assert len(pieces) > 3, deltas


def _cut_inside_third_call(client, no_list_end) -> int:
    """A max_tokens that cuts the output while the third call's parameters are written."""
    answer = client.chat.completions.create(
        **REQUEST, max_tokens=220, logit_bias=no_list_end, logprobs=True
    )
    text = ""
    for count, token in enumerate(answer.choices[0].logprobs.content, start=1):
        text += token.token
        if len(re.findall(r'"parameters":\s*\{', text)) == 3:
            return count + 1
    raise AssertionError(f"fewer than three calls in {text!r}")


def test_a_required_call_cut_by_max_tokens_is_never_content(client, no_list_end):
    max_tokens = _cut_inside_third_call(client, no_list_end)
    request = dict(REQUEST, max_tokens=max_tokens, logit_bias=no_list_end)
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "length" and whole.message.content is None
    closed = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert len(closed) == 2 and all(isinstance(json.loads(a), dict) for _, a in closed)

    chunks = list(client.chat.completions.create(**request, stream=True))
    calls, _, content = _streamed(chunks)
    assert content == "" and _finish(chunks) == "length"
    assert [calls[0], calls[1]] == closed
    # The third call went out as far as it was written: its name and a prefix of its arguments.
    assert set(calls) == {0, 1, 2} and calls[2][0] in ("get_weather", "get_time")
    assert calls[2][1].startswith("{") and not calls[2][1].endswith("}")


def test_a_required_list_cut_before_any_call_closes_is_empty(client):
    whole = client.chat.completions.create(**REQUEST, max_tokens=3).choices[0]
    assert whole.finish_reason == "length"
    assert whole.message.content is None and not whole.message.tool_calls
    chunks = list(client.chat.completions.create(**REQUEST, max_tokens=3, stream=True))
    calls, _, content = _streamed(chunks)
    assert content == "" and calls == {} and _finish(chunks) == "length"


def test_responses_api_streams_required_calls_as_they_are_written(client):
    """The Responses API shares the chat path: function_call items open and fill in pieces."""
    tools = [{"type": "function", **tool["function"]} for tool in (WEATHER_TOOL, TIME_TOOL)]
    request = dict(
        model="tiny",
        input="Weather and time in Paris?",
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_output_tokens=200,
    )
    whole = client.responses.create(**request)
    expected = [(i.name, i.arguments) for i in whole.output if i.type == "function_call"]
    assert expected and whole.status == "completed"
    events = list(client.responses.create(**request, stream=True))
    done = events[-1].response
    assert [(i.name, i.arguments) for i in done.output if i.type == "function_call"] == expected
    assert not [i for i in done.output if i.type == "message"]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > len(expected)


def test_an_auto_call_cut_by_max_tokens_is_never_content(client):
    """tool_choice=auto with hermes: a call cut inside its arguments leaves the text before it
    as content, whole and streamed, and its raw text nowhere."""
    call = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}</tool_call>'
    )
    regex = "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in "Checking. " + call)
    request = dict(
        REQUEST,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        extra_body={"guided_regex": regex},
    )
    answer = client.chat.completions.create(**request, max_tokens=160, logprobs=True)
    assert answer.choices[0].message.tool_calls[0].function.name == "get_weather"
    text, max_tokens = "", 0
    while '"city"' not in text:
        text += answer.choices[0].logprobs.content[max_tokens].token
        max_tokens += 1
    whole = client.chat.completions.create(**request, max_tokens=max_tokens).choices[0]
    assert whole.finish_reason == "length"
    assert whole.message.content == "Checking." and not whole.message.tool_calls
    chunks = list(client.chat.completions.create(**request, max_tokens=max_tokens, stream=True))
    calls, _, content = _streamed(chunks)
    assert content.strip() == "Checking." and _finish(chunks) == "length"
    # The call went out as far as it was written: its name and a prefix of its arguments.
    full = answer.choices[0].message.tool_calls[0].function.arguments
    assert calls == {0: ("get_weather", calls[0][1])}
    assert calls[0][1].startswith('{"city"') and full.startswith(calls[0][1])
