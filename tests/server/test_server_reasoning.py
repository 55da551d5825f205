"""Reasoning parsers split <think>...</think> from the answer, whole and streamed."""

from __future__ import annotations

import pytest
from infernetes.runtime.server.reasoning import make_reasoning_parser

CASES = [
    ("deepseek_r1", "<think>plan it</think>The answer.", "plan it", "The answer."),
    ("deepseek_r1", "plan it</think>The answer.", "plan it", "The answer."),
    ("deepseek_r1", "still thinking", "still thinking", None),
    ("qwen3", "<think>plan it</think>The answer.", "plan it", "The answer."),
    ("qwen3", "No thinking here.", None, "No thinking here."),
    ("qwen3", "<think>cut off", "cut off", None),
]


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_split(name, text, reasoning, content):
    split = make_reasoning_parser(name).split(text)
    assert (split.reasoning, split.content) == (reasoning, content)


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
@pytest.mark.parametrize("piece", [1, 3])
def test_stream_matches_split(name, text, reasoning, content, piece):
    stream = make_reasoning_parser(name).stream()
    got_reasoning = got_content = ""
    for i in range(0, len(text), piece):
        r, c = stream.feed(text[i : i + piece])
        got_reasoning += r
        got_content += c
    r, c = stream.finish()
    got_reasoning += r
    got_content += c
    assert got_reasoning == (reasoning or "")
    assert got_content == (content or "")


def test_unknown_parser_named_in_error():
    with pytest.raises(ValueError, match=r"granite.*supported: deepseek_r1, qwen3"):
        make_reasoning_parser("granite")
