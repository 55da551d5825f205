"""Reasoning parsers split <think>...</think> from the answer, whole and streamed."""

from __future__ import annotations

import pytest
from infernetes.runtime.server.reasoning import make_reasoning_parser

CASES = [
    ("deepseek_r1", "<think>plan it</think>The answer.", "plan it", "The answer."),
    ("deepseek_r1", "plan it</think>The answer.", "plan it", "The answer."),
    ("deepseek_r1", "still thinking", "still thinking", None),
    # deepseek_v3 reads as deepseek_r1 once its template was told to think.
    ("deepseek_v3", "plan it</think>The answer.", "plan it", "The answer."),
    ("qwen3", "<think>plan it</think>The answer.", "plan it", "The answer."),
    ("qwen3", "No thinking here.", None, "No thinking here."),
    ("qwen3", "<think>cut off", "cut off", None),
    # Each model's own tags, from its chat template (the reasoning may hold the other tags).
    ("glm45", "<think>规划 <b>x</b></think>\nDone.", "规划 <b>x</b>", "\nDone."),
    ("glm45", "plan</think>Done.", "plan", "Done."),
    ("glm47", "\nplan</think>Done.", "\nplan", "Done."),
    ("minimax_m2", "Let me see.\n</think>\n\nIt is 4.", "Let me see.\n", "\n\nIt is 4."),
    ("minimax_m2", "cut off <thi", "cut off <thi", None),
    (
        "seed_oss",
        "<seed:think>budget<seed:cot_budget_reflect>ok</seed:cot_budget_reflect></seed:think>Oui.",
        "budget<seed:cot_budget_reflect>ok</seed:cot_budget_reflect>",
        "Oui.",
    ),
    (
        "seed_oss",
        "thinking <think>not ours</think> still",
        "thinking <think>not ours</think> still",
        None,
    ),
    (
        "granite",
        "Here is my thought process:\nAdd them.\nHere is my response:\n4",
        "\nAdd them.\n",
        "\n4",
    ),
    ("granite", "Here's my thought process: a\nHere's my response: b", " a\n", " b"),
    ("granite", "Here is the answer: 4", None, "Here is the answer: 4"),
    ("granite", "Here is my thought process: cut", " cut", None),
    ("mistral", "[THINK]2+2 → 4[/THINK]**4**", "2+2 → 4", "**4**"),
    ("mistral", "[THINK", None, "[THINK"),
    ("mistral", "Plain answer [THINK] later.", None, "Plain answer [THINK] later."),
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


@pytest.mark.parametrize(("name", "text", "reasoning", "content"), CASES)
def test_stream_split_anywhere_matches_split(name, text, reasoning, content):
    for at in range(len(text) + 1):
        stream = make_reasoning_parser(name).stream()
        pieces = [stream.feed(text[:at]), stream.feed(text[at:]), stream.finish()]
        assert "".join(r for r, _ in pieces) == (reasoning or "")
        assert "".join(c for _, c in pieces) == (content or "")


@pytest.mark.parametrize(
    ("template_kwargs", "thinks"),
    [
        ({"thinking": True}, True),
        ({"enable_thinking": True}, True),
        ({"thinking": False, "enable_thinking": False}, False),
        ({}, False),
    ],
)
def test_deepseek_v3_thinks_only_when_its_template_is_told_to(template_kwargs, thinks):
    parser = make_reasoning_parser("deepseek_v3").for_request(template_kwargs)
    assert (parser is not None) == thinks
    assert make_reasoning_parser("qwen3").for_request(template_kwargs) is not None


def test_unknown_parser_named_in_error():
    with pytest.raises(ValueError, match=r"nope.*supported: deepseek_r1, deepseek_v3, glm45"):
        make_reasoning_parser("nope")
