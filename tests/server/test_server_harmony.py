"""gpt-oss's harmony format through openai-harmony: ``--reasoning-parser openai_gptoss`` (the
analysis channel) and ``--tool-call-parser openai`` (commentary messages to ``functions.NAME``),
whole, streamed (split anywhere, a character at a time) and cut by max_tokens. The outputs are
written as the format is published (openai/harmony's docs, the gpt-oss model card)."""

from __future__ import annotations

import json

import pytest
from infernetes.runtime.server.harmony import harmony_encoding
from infernetes.runtime.server.reasoning import make_reasoning_parser
from infernetes.runtime.server.tool_parsers import make_tool_parser

pytestmark = pytest.mark.usefixtures("harmony_env")

NESTED = {"city": "Zürich", "filters": {"tags": ["café", "日本語"], "range": [1, 2.5], "ok": None}}
UNICODE = {"query": 'emoji 🙂 and "quotes" \\ back', "lang": "ελληνικά"}
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather — zwei Tage.<|end|>"


def call_in_channel(name: str, args: dict) -> str:
    """A call with its recipient after the channel (how gpt-oss mostly writes it)."""
    return (
        f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
        f"<|message|>{json.dumps(args, ensure_ascii=False)}<|call|>"
    )


def call_in_role(name: str, args: dict) -> str:
    """A call with its recipient in the role part of the header (the format allows both)."""
    return (
        f"<|start|>assistant to=functions.{name}<|channel|>commentary json"
        f"<|message|>{json.dumps(args, ensure_ascii=False)}<|call|>"
    )


ANSWER = "Sunny in Zürich — 晴れ."
FINAL = f"{ANALYSIS}<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
PREAMBLE = "I'll look that up."
CALLS = (
    ANALYSIS
    + f"<|start|>assistant<|channel|>commentary<|message|>{PREAMBLE}<|end|>"
    + call_in_channel("get_weather", NESTED)
    + call_in_role("search", UNICODE)
)
EXPECTED_CALLS = [("get_weather", NESTED), ("search", UNICODE)]
REASONING = "The user wants the weather — zwei Tage."


def _calls(tool_calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


def test_analysis_is_reasoning_and_final_is_content():
    split = make_reasoning_parser("openai_gptoss").split(FINAL)
    assert (split.reasoning, split.content) == (REASONING, ANSWER)
    found = make_tool_parser("openai", None).extract(FINAL)
    assert not found.tools_called and found.content == ANSWER


def test_several_calls_with_nested_and_unicode_arguments():
    found = make_tool_parser("openai", None).extract(CALLS)
    assert found.tools_called and _calls(found.tool_calls) == EXPECTED_CALLS
    assert found.content == PREAMBLE  # a commentary message to no one is shown to the user
    parser = make_tool_parser("openai", None)
    assert [(c.name, json.loads(c.arguments)) for c in parser.parse_section(CALLS, True)] == (
        EXPECTED_CALLS
    )
    assert make_reasoning_parser("openai_gptoss").split(CALLS).reasoning == REASONING


def test_the_end_of_generation_closes_a_call_whose_stop_token_is_not_in_the_text():
    text = CALLS.removesuffix("<|call|>")  # the engine leaves the stop token out
    found = make_tool_parser("openai", None).extract(text)
    assert _calls(found.tool_calls) == EXPECTED_CALLS


def _raw_calls(tool_calls):
    return [(c.function.name, c.function.arguments) for c in tool_calls]


def _stream_tools(text: str, pieces: list[str], cut: bool = False):
    stream = make_tool_parser("openai", None).stream()
    content, deltas = "", []
    for piece in pieces:
        delta = stream.feed(piece)
        content += delta.content
        deltas += delta.tool_calls
    delta = stream.finish(cut=cut)
    content += delta.content
    deltas += delta.tool_calls
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.name is not None:
            assert d.index not in calls and d.id
            calls[d.index] = [d.name, ""]
        calls[d.index][1] += d.arguments
    return content, [(name, args) for name, args in calls.values()], deltas


def _stream_reasoning(pieces: list[str]):
    stream = make_reasoning_parser("openai_gptoss").stream()
    reasoning = content = ""
    for piece in pieces:
        r, c = stream.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("text", [FINAL, CALLS], ids=["final", "calls"])
def test_streamed_a_character_at_a_time_matches_whole(text):
    pieces = list(text)
    content, calls, _ = _stream_tools(text, pieces)
    whole = make_tool_parser("openai", None).extract(text)
    assert content == (whole.content or "") and calls == _raw_calls(whole.tool_calls)
    split = make_reasoning_parser("openai_gptoss").split(text)
    assert _stream_reasoning(pieces) == (split.reasoning or "", split.content or "")


@pytest.mark.parametrize("text", [FINAL, CALLS], ids=["final", "calls"])
def test_streamed_split_anywhere_matches_whole(text):
    whole = make_tool_parser("openai", None).extract(text)
    split = make_reasoning_parser("openai_gptoss").split(text)
    for at in range(1, len(text), 3):
        pieces = [text[:at], text[at:]]
        content, calls, _ = _stream_tools(text, pieces)
        assert (content, calls) == (whole.content or "", _raw_calls(whole.tool_calls)), at
        assert _stream_reasoning(pieces) == (split.reasoning or "", split.content or ""), at


def test_arguments_stream_as_they_are_generated():
    encoding = harmony_encoding()
    ids = encoding.encode(CALLS, allowed_special="all")
    pieces = [encoding.decode([token]) for token in ids]  # as the model writes them
    _, calls, deltas = _stream_tools(CALLS, pieces)
    assert [(name, json.loads(args)) for name, args in calls] == EXPECTED_CALLS
    first = [d for d in deltas if d.index == 0]
    assert first[0].name == "get_weather" and len(first) > 3, "arguments came in one piece"


def test_cut_by_max_tokens_keeps_closed_calls_and_never_shows_markup():
    second = CALLS.index("<|start|>assistant to=functions.search")
    for cut_at in (second + 5, second + 40, len(CALLS) - 12):
        text = CALLS[:cut_at]
        found = make_tool_parser("openai", None).extract(text, cut=True)
        assert _calls(found.tool_calls) == EXPECTED_CALLS[:1]
        assert found.content == PREAMBLE
        content, calls, _ = _stream_tools(text, list(text), cut=True)
        assert content == PREAMBLE
        # The call being written was streamed as far as it went, as with every parser.
        assert calls[0] == _raw_calls(found.tool_calls)[0] and len(calls) <= 2
    in_header = FINAL[: FINAL.index("final") + 2]
    assert make_reasoning_parser("openai_gptoss").split(in_header).content is None
    assert _stream_reasoning(list(in_header)) == (REASONING, "")


def test_plain_text_is_content():
    text = 'Just text, no channels: café {"a": 1}'
    found = make_tool_parser("openai", None).extract(text)
    assert not found.tools_called and found.content == text
    assert make_reasoning_parser("openai_gptoss").split(text).content == text
    assert _stream_tools(text, list(text))[0] == text
    assert make_tool_parser("openai", None).extract(text, cut=True).content == text
    assert _stream_tools(text, list(text), cut=True)[0] == text


def test_a_missing_vocabulary_is_named_with_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    harmony_encoding.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"TIKTOKEN_ENCODINGS_BASE=.* o200k_base\.tiktoken"):
            harmony_encoding()
    finally:
        harmony_encoding.cache_clear()
