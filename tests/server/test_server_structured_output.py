"""llguidance-backed structured output: masks keep a random-logits sampler inside the grammar."""

from __future__ import annotations

import json
import re

import pytest
import torch
from infernetes.runtime.server.structured_output import (
    Guide,
    GuideError,
    check_backend,
    grammar_for,
    make_logits_processor,
)
from infernetes.runtime.testing import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _generate(processor, tokenizer, vocab, seed=0, limit=80, prefix=()):
    generator = torch.Generator().manual_seed(seed)
    out = list(prefix)
    for _ in range(limit):
        logits = processor(out, torch.randn(vocab, generator=generator))
        token = int(torch.argmax(logits))
        if token == tokenizer.eos_token_id:
            return tokenizer.decode(out), True
        out.append(token)
    return tokenizer.decode(out), False


SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("guide", "check"),
    [
        (
            Guide("json", SCHEMA, "guided_json"),
            lambda s: (
                set(json.loads(s)) == {"answer", "n"} and json.loads(s)["answer"] in ("yes", "no")
            ),
        ),
        (
            Guide("json", json.dumps(SCHEMA), "guided_json"),
            lambda s: json.loads(s)["n"] in range(10),
        ),
        (
            Guide("regex", r"[0-9]{3}-(ok|ko)", "guided_regex"),
            lambda s: re.fullmatch(r"[0-9]{3}-(ok|ko)", s),
        ),
        (
            Guide("choice", ["Paris", "London", "Rome"], "guided_choice"),
            lambda s: s in ("Paris", "London", "Rome"),
        ),
        (
            Guide("grammar", 'root ::= "yes" | "no" | "maybe"', "guided_grammar"),
            lambda s: s in ("yes", "no", "maybe"),
        ),
        (Guide("grammar", 'start: "a" ("b" | "c")', "guided_grammar"), lambda s: s in ("ab", "ac")),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_follows_constraint(tokenizer, guide, check, seed):
    vocab = len(tokenizer) + 7  # models often pad the vocabulary
    processor = make_logits_processor(guide, tokenizer, vocab, compact_json=True)
    text, finished = _generate(processor, tokenizer, vocab, seed)
    assert finished, text
    assert check(text), text


def test_json_object_is_an_object(tokenizer):
    vocab = len(tokenizer)
    processor = make_logits_processor(
        Guide("json_object", None, "response_format"), tokenizer, vocab
    )
    text, _ = _generate(processor, tokenizer, vocab, limit=12)
    assert text.lstrip().startswith("{")


def test_diverging_sequences_keep_separate_state(tokenizer):
    """n > 1: the processor is shared by the sequences of a request; each keeps its own state."""
    vocab = len(tokenizer)
    processor = make_logits_processor(
        Guide("choice", ["Paris", "London"], "guided_choice"), tokenizer, vocab
    )
    paris = tokenizer.encode("Paris", add_special_tokens=False)
    london = tokenizer.encode("London", add_special_tokens=False)
    first = processor([], torch.zeros(vocab))
    assert first[paris[0]] == 0 and first[london[0]] == 0
    # Interleave the two sequences step by step.
    for step in range(1, max(len(paris), len(london)) + 1):
        for seq in (paris, london):
            logits = processor(seq[:step], torch.zeros(vocab))
            if step < len(seq):
                assert logits[seq[step]] == 0
            else:
                allowed = torch.nonzero(logits == 0).flatten().tolist()
                assert allowed == [tokenizer.eos_token_id]


@pytest.mark.parametrize(
    ("guide", "param"),
    [
        (Guide("json", "{not json", "guided_json"), "guided_json"),
        (
            Guide("json", [1, 2], "response_format.json_schema.schema"),
            "response_format.json_schema.schema",
        ),
        (Guide("regex", "(", "guided_regex"), "guided_regex"),
        (Guide("grammar", "root ::::", "guided_grammar"), "guided_grammar"),
    ],
)
def test_invalid_constraints_name_the_field(guide, param):
    with pytest.raises(GuideError) as info:
        grammar_for(guide)
    assert info.value.param == param and param in str(info.value)


def test_backends():
    check_backend("auto")
    check_backend("guidance:disable-any-whitespace")
    with pytest.raises(GuideError, match=r"xgrammar.*not supported yet"):
        check_backend("xgrammar")
