"""Regex shorthand classes are ASCII in structured output, as under vLLM's default backend
(xgrammar): llguidance alone reads them as Unicode classes."""

from __future__ import annotations

import re

import llguidance
import pytest
from infernetes.runtime.engine.ascii_classes import ascii_classes, ascii_schema_patterns
from infernetes.runtime.engine.guidance_backend import grammar_for
from infernetes.runtime.sampling_params import StructuredOutputsParams


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (r"\d{3}-\d{4}", "[0-9]{3}-[0-9]{4}"),
        (r"\w+", "[0-9A-Za-z_]+"),
        (r"\s", r"[ \t\n\r\f\v]"),
        (r"\D\W\S", r"[^0-9][^0-9A-Za-z_][^ \t\n\r\f\v]"),
        (r"[\d.]+", "[0-9.]+"),
        (r"[^\w-]", "[^0-9A-Za-z_-]"),
        (r"[\D]", r"[\D]"),  # a negated shorthand inside brackets has no range spelling
        (r"\\d", r"\\d"),  # an escaped backslash, then a d
        (r"[]\d]", "[]0-9]"),  # a ']' first in a class is a member
        (r"\.\+\(", r"\.\+\("),
        ("plain", "plain"),
    ],
)
def test_shorthands_become_ascii_classes(pattern, expected):
    assert ascii_classes(pattern) == expected


@pytest.mark.parametrize("text", ["123-4567", "۸40-᱙߃98", "١٢٣-٤٥٦٧"])
def test_rewritten_pattern_matches_only_ascii_digits(text):
    # Python's re, like Rust's, reads \d as Unicode: the rewrite is what narrows it
    assert re.fullmatch(r"\d{3}-\d{4}", text)
    assert bool(re.fullmatch(ascii_classes(r"\d{3}-\d{4}"), text)) == text.isascii()


def _accepts(grammar: str, text: str) -> bool:
    """Whether llguidance's matcher over a byte-level tokenizer takes ``text`` whole."""
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    ok = matcher.consume_tokens(list(text.encode()))
    return ok and matcher.is_accepting()


class _ByteTokenizer:
    """256 single-byte tokens and an EOS: every string has one tokenization."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"</s>"]

    def __call__(self, text):
        return list(text.encode())


def test_the_engine_grammar_refuses_non_ascii_digits():
    regex = grammar_for(StructuredOutputsParams("regex", r"\d{3}-\d{4}", "regex"))
    assert _accepts(regex, "123-4567")
    assert not _accepts(regex, "۸40-᱙߃98")
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": r"^\d{5}$"}}}
    assert ascii_schema_patterns(schema)["properties"]["zip"]["pattern"] == "^[0-9]{5}$"
    grammar = grammar_for(StructuredOutputsParams("json", schema, "json"))
    assert _accepts(grammar, '{"zip": "12345"}')
    assert not _accepts(grammar, '{"zip": "١٢٣٤٥"}')
