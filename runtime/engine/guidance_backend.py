"""The guidance backend of structured output (llguidance, the default: "auto" settles on it).

Lark and llama.cpp's GBNF grammars both compile (llguidance tells them apart); ``\\d``, ``\\w``
and ``\\s`` are ASCII, as under vLLM's default backend (``ascii_classes``).
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
from infernetes.runtime.engine.ascii_classes import ascii_classes, ascii_schema_patterns
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.sampling_params import StructuredOutputsParams
from infernetes.runtime.tokenization.mistral import MistralTokenizer


def grammar_for(constraint: StructuredOutputsParams) -> str:
    """The llguidance grammar (a JSON string) of ``constraint``; RequestError if it is invalid."""
    param = constraint.param
    try:
        if constraint.kind in ("json", "json_object"):
            schema = {"type": "object"} if constraint.kind == "json_object" else constraint.spec
            return llguidance.LLMatcher.grammar_from_json_schema(
                _schema_with_options(schema, param, bool(constraint.compact))
            )
        if constraint.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(ascii_classes(constraint.spec))
        if constraint.kind == "choice":
            return llguidance.grammar_from("choice", json.dumps([str(c) for c in constraint.spec]))
        if constraint.kind == "grammar":
            # Lark or GBNF (llama.cpp's, as vLLM's guided_grammar accepts): llguidance tells them apart.
            return llguidance.grammar_from("grammar", constraint.spec)
    except RequestError:
        raise
    except Exception as exc:  # llguidance raises ValueError/RuntimeError on bad input
        raise RequestError(f"{param}: invalid constraint: {exc}", param) from exc
    raise RequestError(f"unknown structured-output kind {constraint.kind!r}", param)


def _schema_with_options(schema: Any, param: str, compact: bool) -> dict:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{param} is not valid JSON: {exc}", param) from exc
    if not isinstance(schema, dict):
        raise RequestError(f"{param} must be a JSON object (a JSON schema)", param)
    schema = ascii_schema_patterns(schema)
    if compact:
        schema = {
            **schema,
            "x-guidance": {**schema.get("x-guidance", {}), "whitespace_flexible": False},
        }
    return schema


class GuidanceMatcher:
    """One sequence's llguidance matcher."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fork(self) -> GuidanceMatcher:
        return GuidanceMatcher(self.matcher.deep_copy())

    def is_stopped(self) -> bool:
        return self.matcher.is_stopped()

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)

    def try_accept(self, token: int) -> bool:
        if self.matcher.is_stopped() or self.matcher.validate_tokens([token]) != 1:
            return False
        return self.matcher.consume_token(token)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        if self.matcher.is_error():  # it cannot go on: every token, so its limits end it
            bitmask[row] = -1
        else:
            llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row)


class GuidanceCompiler:
    """Compiles constraints over one tokenizer, whose llguidance index is built once."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        if isinstance(tokenizer, MistralTokenizer):  # mistral_common's own llguidance view
            from mistral_common.guidance.tokenizer import MistralLLGTokenizer

            wrapper = llguidance.TokenizerWrapper(MistralLLGTokenizer(tokenizer.tekken))
            self._ll_tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size)
        else:
            self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def compile(self, constraint: StructuredOutputsParams) -> GuidanceMatcher:
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar_for(constraint))
        if matcher.is_error():
            raise RequestError(
                f"{constraint.param}: invalid constraint: {matcher.get_error()}", constraint.param
            )
        return GuidanceMatcher(matcher)
