"""The tool-call formats of DeepSeek, Kimi, GLM, Granite, MiniMax, Seed-OSS, Step, xLAM and
GigaChat models, each from
the model's published chat template: text before the calls, two calls, nested JSON and
non-ASCII arguments; whole, and streamed in every split (the streamed pieces join up to exactly
the whole result)."""

from __future__ import annotations

import json

import pytest
from infernetes.runtime.server.protocol import ChatTool
from infernetes.runtime.server.tool_parsers import make_tool_parser

TOOLS = [
    ChatTool.model_validate(
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
    ),
    ChatTool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "search",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "filters": {"type": "object"}},
                },
            },
        }
    ),
]
FILTERS = {"tags": ["café", "ß"], "nested": {"x": 1.5, "ok": True, "none": None}}
EXPECTED = [
    ("get_weather", {"city": "São Paulo", "days": 2}),
    ("search", {"query": '北京 天气 "quoted"', "filters": FILTERS}),
]
ARGS = [json.dumps(args, ensure_ascii=False) for _, args in EXPECTED]
CONTENT = "Let me look that up — één moment."

CASES: dict[str, str] = {
    "deepseek_v3": (
        f"{CONTENT}<｜tool▁calls▁begin｜>"
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{ARGS[0]}\n```<｜tool▁call▁end｜>\n"
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{ARGS[1]}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>"
    ),
    "deepseek_v31": (
        f"{CONTENT}<｜tool▁calls▁begin｜>"
        f"<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{ARGS[0]}<｜tool▁call▁end｜>"
        f"<｜tool▁call▁begin｜>search<｜tool▁sep｜>{ARGS[1]}<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>"
    ),
    "glm45": (
        f"{CONTENT}\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>São Paulo</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n"
        f"<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>{EXPECTED[1][1]['query']}</arg_value>\n"
        f"<arg_key>filters</arg_key>\n<arg_value>{json.dumps(FILTERS, ensure_ascii=False)}</arg_value>\n"
        "</tool_call>"
    ),
    "glm47": (
        f"{CONTENT}<tool_call>get_weather<arg_key>city</arg_key><arg_value>São Paulo</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        f"<tool_call>search<arg_key>query</arg_key><arg_value>{EXPECTED[1][1]['query']}</arg_value>"
        f"<arg_key>filters</arg_key><arg_value>{json.dumps(FILTERS)}</arg_value></tool_call>"
    ),
    "seed_oss": (
        f"{CONTENT}\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>São Paulo</parameter>\n"
        "<parameter=days>2</parameter>\n</function>\n</seed:tool_call>\n"
        f"<seed:tool_call>\n<function=search>\n<parameter=query>\n{EXPECTED[1][1]['query']}\n</parameter>\n"
        f"<parameter=filters>\n{json.dumps(FILTERS, ensure_ascii=False)}\n</parameter>\n"
        "</function>\n</seed:tool_call>"
    ),
    "minimax_m2": (
        f'{CONTENT}\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">São Paulo</parameter>\n<parameter name="days">2</parameter>\n'
        '</invoke>\n<invoke name="search">\n'
        f'<parameter name="query">{EXPECTED[1][1]["query"]}</parameter>\n'
        f'<parameter name="filters">{json.dumps(FILTERS, ensure_ascii=False)}</parameter>\n'
        "</invoke>\n</minimax:tool_call>"
    ),
    "granite": (
        f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGS[0]}}}, '
        f'{{"name": "search", "arguments": {ARGS[1]}}}]'
    ),
    "llama4_pythonic": (
        "<|python_start|>[get_weather(city='São Paulo', days=2), "
        f"search(query={EXPECTED[1][1]['query']!r}, filters={FILTERS!r})]<|python_end|>"
    ),
    "olmo3": (
        "<function_calls>get_weather(city='São Paulo', days=2)\n"
        f"search(query={EXPECTED[1][1]['query']!r}, filters={json.dumps(FILTERS, ensure_ascii=False)})"
        "\n</function_calls>"
    ),
    "jamba": (
        f'{CONTENT} <tool_calls>[{{"name": "get_weather", "arguments": {ARGS[0]}}},\n'
        f'{{"name": "search", "arguments": {ARGS[1]}}}]</tool_calls>'
    ),
    "minimax_m1": (
        f'{CONTENT}\n<tool_calls>\n{{"name": "get_weather", "arguments": {ARGS[0]}}}\n'
        f'{{"name": "search", "arguments": {ARGS[1]}}}\n</tool_calls>'
    ),
    "phi4_mini_json": (
        f'{CONTENT}functools[{{"name": "get_weather", "arguments": {ARGS[0]}}}, '
        f'{{"name": "search", "parameters": {ARGS[1]}}}]'
    ),
    "granite-20b-fc": (
        f'{CONTENT} <function_call> {{"name": "get_weather", "arguments": {ARGS[0]}}} '
        f'<function_call> {{"name": "search", "arguments": {ARGS[1]}}}'
    ),
    "hunyuan_a13b": (
        f'{CONTENT}<tool_calls>[{{"name": "get_weather", "arguments": {ARGS[0]}}}, '
        f'{{"name": "search", "arguments": {ARGS[1]}}}]</tool_calls>'
    ),
    "internlm": (
        f'{CONTENT}<|action_start|><|plugin|>\n{{"name": "get_weather", "parameters": {ARGS[0]}}}'
        f'<|action_end|>\n<|action_start|><|plugin|>\n{{"name": "search", "parameters": {ARGS[1]}}}'
        "<|action_end|>"
    ),
    "xlam": (
        f'{CONTENT}\n```json\n[{{"name": "get_weather", "arguments": {ARGS[0]}}}, '
        f'{{"name": "search", "arguments": {ARGS[1]}}}]\n```'
    ),
    "step3p5": (
        f"{CONTENT}\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        f"<tool_call>\n<function=search>\n<parameter=query>\n{EXPECTED[1][1]['query']}\n</parameter>\n"
        f"<parameter=filters>\n{json.dumps(FILTERS, ensure_ascii=False)}\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    "kimi_k2": (
        f"{CONTENT}<|tool_calls_section_begin|>"
        f"<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{ARGS[0]}<|tool_call_end|>"
        f"<|tool_call_begin|> functions.search:1 <|tool_call_argument_begin|> {ARGS[1]} <|tool_call_end|>"
        "<|tool_calls_section_end|>"
    ),
}
# Formats whose calls can only open the output: no content before them.
LEADING = {"granite", "llama4_pythonic", "olmo3"}


def _calls(tool_calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


def _stream(name: str, pieces: list[str]):
    """Feeds ``pieces``: (content, tool-call deltas, stream)."""
    stream = make_tool_parser(name, TOOLS).stream()
    content, deltas = "", []
    for piece in pieces:
        delta = stream.feed(piece)
        content += delta.content
        deltas += delta.tool_calls
    final = stream.finish()
    return content + final.content, deltas + final.tool_calls, stream


def _check_stream(name: str, pieces: list[str]) -> None:
    whole = make_tool_parser(name, TOOLS).extract("".join(pieces)).tool_calls
    content, deltas, stream = _stream(name, pieces)
    headers = [d for d in deltas if d.name is not None]
    assert [(d.index, d.name) for d in headers] == [(0, "get_weather"), (1, "search")]
    assert len({d.id for d in headers}) == 2
    joined = ["".join(d.arguments for d in deltas if d.index == i) for i in (0, 1)]
    assert joined == [c.function.arguments for c in whole]
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)
    assert content.strip() == (CONTENT if name not in LEADING else "")
    assert stream.calls_sent == 2


@pytest.mark.parametrize("name", sorted(CASES))
def test_extracts_calls_and_content(name):
    result = make_tool_parser(name, TOOLS).extract(CASES[name])
    assert result.tools_called
    assert _calls(result.tool_calls) == EXPECTED
    assert result.content == (CONTENT if name not in LEADING else None)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_in_chunks_matches_whole(name, size):
    text = CASES[name]
    _check_stream(name, [text[at : at + size] for at in range(0, len(text), size)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_split_anywhere_matches_whole(name):
    text = CASES[name]
    for at in range(len(text) + 1):
        _check_stream(name, [text[:at], text[at:]])


@pytest.mark.parametrize("name", sorted(CASES))
def test_arguments_stream_while_written(name):
    """A character at a time, the first call's arguments go out in many pieces, the first long
    before the call is complete."""
    _, deltas, _ = _stream(name, list(CASES[name]))
    first = [d.arguments for d in deltas if d.index == 0 and d.arguments]
    assert len(first) > 3, first
    assert first[0] != json.dumps(EXPECTED[0][1], ensure_ascii=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_is_content(name):
    text = "No tools: <tool> [x] {y} ``` a | b — ß."
    parser = make_tool_parser(name, TOOLS)
    result = parser.extract(text)
    assert not result.tools_called and result.content == text
    content, deltas, stream = _stream(name, list(text))
    assert content == text and not deltas and not stream.tools_called


def test_kimi_keeps_the_call_ids_the_model_wrote():
    """Kimi's chat template writes each call's id back in later turns: whole and streamed, the
    calls keep ``functions.NAME:INDEX``."""
    whole = make_tool_parser("kimi_k2", TOOLS).extract(CASES["kimi_k2"]).tool_calls
    assert [c.id for c in whole] == ["functions.get_weather:0", "functions.search:1"]
    _, deltas, _ = _stream("kimi_k2", list(CASES["kimi_k2"]))
    assert [d.id for d in deltas if d.name] == ["functions.get_weather:0", "functions.search:1"]


def test_glm_keeps_string_values_verbatim_and_reads_the_rest_as_json():
    text = (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>  Paris\n</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value> 3 </arg_value>\n</tool_call>"
        "<tool_call>now</tool_call>"
    )
    calls = make_tool_parser("glm45", TOOLS).extract(text).tool_calls
    assert _calls(calls) == [("get_weather", {"city": "  Paris\n", "days": 3}), ("now", {})]


@pytest.mark.parametrize("opening", ["<tool_call>", "", "  \n"])
def test_granite_list_opens_with_the_31_tag_or_bare(opening):
    text = CASES["granite"].replace("<|tool_call|>", opening)
    assert _calls(make_tool_parser("granite", TOOLS).extract(text).tool_calls) == EXPECTED
    _check_stream("granite", list(text))


CLOSING = {
    "deepseek_v3": "<｜tool▁call▁end｜>",
    "deepseek_v31": "<｜tool▁call▁end｜>",
    "glm45": "</tool_call>",
    "glm47": "</tool_call>",
    "kimi_k2": "<|tool_call_end|>",
    "minimax_m2": "</invoke>",
    "seed_oss": "</function>",
    "step3p5": "</function>",
}


@pytest.mark.parametrize("name", sorted(CLOSING))
def test_a_call_cut_off_is_not_a_call(name):
    """Output truncated inside the second call: the first is whole, the cut one is dropped
    rather than returned with half its arguments."""
    text = CASES[name]
    cut = text[: text.rindex(CLOSING[name]) - 3]
    result = make_tool_parser(name, TOOLS).extract(cut)
    assert _calls(result.tool_calls) == EXPECTED[:1]
    first_only = text[: text.index(CLOSING[name]) - 3]
    assert not make_tool_parser(name, TOOLS).extract(first_only).tools_called


def test_olmo3_closing_tag_may_be_left_out():
    text = CASES["olmo3"].removesuffix("\n</function_calls>")
    assert _calls(make_tool_parser("olmo3", TOOLS).extract(text).tool_calls) == EXPECTED
    _check_stream("olmo3", list(text))


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_cut_by_max_tokens_never_becomes_content(name):
    """Each output cut at every position (as max_tokens cuts it): whole and streamed agree on
    the calls closed before the cut, the call being written is never content, and once the
    tool section has begun none of it is."""
    text = CASES[name]
    parser = make_tool_parser(name, TOOLS)
    full = parser.extract(text).tool_calls
    for cut in range(len(text)):
        prefix = text[:cut]
        whole = parser.extract(prefix, cut=True)
        stream = parser.stream()
        content, deltas = "", []
        for at in range(0, len(prefix), 5):
            delta = stream.feed(prefix[at : at + 5])
            content, deltas = content + delta.content, deltas + delta.tool_calls
        final = stream.finish(cut=True)
        content, deltas = content + final.content, deltas + final.tool_calls
        if not whole.tools_called:
            assert content == prefix and not deltas
            continue
        assert content.strip() == (whole.content or "")
        closed = [(c.function.name, c.function.arguments) for c in whole.tool_calls]
        assert closed == [(c.function.name, c.function.arguments) for c in full[: len(closed)]]
        streamed = {
            i: "".join(d.arguments for d in deltas if d.index == i)
            for i in {d.index for d in deltas}
        }
        assert [streamed[i] for i in range(len(closed))] == [args for _, args in closed]
        for index in set(streamed) - set(range(len(closed))):
            assert full[index].function.arguments.startswith(streamed[index])
    for marker in (m for m in parser.markers if m in text):
        cut = text.index(marker) + len(marker) + 1
        assert parser.extract(text[:cut], cut=True).tools_called


@pytest.mark.parametrize(
    "opening",
    [
        ("", ""),
        ("[TOOL_CALLS]", ""),
        ("<tool_call>", "</tool_call>"),
        ("```\n", "\n```"),
    ],
)
def test_xlam_list_in_each_of_its_wrappings(opening):
    before, after = opening
    text = CASES["xlam"].split("\n```json\n")[1].removesuffix("\n```")
    text = before + text + after
    result = make_tool_parser("xlam", TOOLS).extract(text)
    assert _calls(result.tool_calls) == EXPECTED and result.content is None
    for at in range(len(text) + 1):
        content, deltas, _ = _stream("xlam", [text[:at], text[at:]])
        assert content.strip() == "" and len([d for d in deltas if d.name]) == 2


def test_xlam_code_block_stays_content():
    text = "Here:\n```python\nprint([1, 2])\n```\nand [a, b]."
    assert not make_tool_parser("xlam", TOOLS).extract(text).tools_called
    content, deltas, _ = _stream("xlam", list(text))
    assert content == text and not deltas


GIGACHAT_CALL = f'{{"name": "search", "arguments": {ARGS[1]}}}'
GIGACHAT_CASES = [
    f"{CONTENT}<|message_sep|>\n\nfunction call<|role_sep|>\n{GIGACHAT_CALL}",
    f"{CONTENT}<|function_call|>{GIGACHAT_CALL}</s>",
    f"function call<|role_sep|>\n{GIGACHAT_CALL}",
]


@pytest.mark.parametrize("text", GIGACHAT_CASES)
def test_gigachat3_one_call_whole_and_streamed_split_anywhere(text):
    """GigaChat3 writes one call a message, after content and its separator."""
    content = CONTENT if text.startswith(CONTENT) else None
    result = make_tool_parser("gigachat3", TOOLS).extract(text)
    assert _calls(result.tool_calls) == EXPECTED[1:] and result.content == content
    for at in range(len(text) + 1):
        streamed, deltas, _ = _stream("gigachat3", [text[:at], text[at:]])
        assert streamed.strip() == (content or "")
        assert [d.name for d in deltas if d.name] == ["search"]
        assert "".join(d.arguments for d in deltas) == result.tool_calls[0].function.arguments
    _, deltas, _ = _stream("gigachat3", list(text))
    assert len([d for d in deltas if d.arguments]) > 3  # arguments go out as written


def test_gigachat3_keeps_special_tokens_for_its_markers():
    assert make_tool_parser("gigachat3", TOOLS).keeps_special_tokens
    assert not make_tool_parser("hermes", TOOLS).keeps_special_tokens
