"""Structured output in the engine core (vLLM V1's ``v1/structured_output/``), through llguidance.

A request's constraint (``SamplingParams.structured_outputs``) is compiled once, here: the input
processor has ``StructuredOutputManager.compile`` turn it into an llguidance grammar and build
the matcher over the core's tokenizer, whose llguidance index is built once per engine. Each
sequence of the request (``n > 1``) gets its own copy of that matcher (``RequestGrammar``),
advanced with every token the request accepts. Each step the manager fills the allowed-token
bitmask of the constrained rows (``GrammarBitmask``), which the workers get with the step and
apply to the logits before sampling: they never see a grammar or a tokenizer.

The API process sends the constraint as asked, not compiled: checking a grammar means compiling
it (llguidance's own validation builds it), a matcher cannot cross the pipe, and a compile here
raises a ``RequestError`` naming the field, which the API already returns as a 400. So the check
and the compile are one act in one place.

A mask must follow every token the request has: under async scheduling the scheduler does not
schedule a constrained request again before the token of its step in flight came back
(``Scheduler._remaining``); under pipeline parallelism no request is scheduled while its step is
in flight anyway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
from infernetes.runtime.engine.ascii_classes import ascii_classes, ascii_schema_patterns
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.engine.request import Request
from infernetes.runtime.engine.scheduler_output import GrammarBitmask, SchedulerOutput
from infernetes.runtime.sampling_params import StructuredOutputsParams


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


class RequestGrammar:
    """One sequence's matcher and how many of its output tokens it has consumed."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.num_consumed = 0

    def copy(self) -> RequestGrammar:
        """A fresh sequence's matcher, without compiling again (``n > 1``)."""
        return RequestGrammar(self.matcher.deep_copy())

    def catch_up(self, output_token_ids: Sequence[int]) -> None:
        """Consume the tokens the request accepted since the last call. A request's tokens only
        grow (a preempted one keeps its own), so the count is all the state needed."""
        for token in output_token_ids[self.num_consumed :]:
            if not self.matcher.is_stopped():  # past the end: EOS, or tokens ignore_eos kept
                self.matcher.consume_token(token)
        self.num_consumed = len(output_token_ids)

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Row ``row`` of ``bitmask``: the tokens the grammar allows next (only EOS once it is
        complete); every token when it cannot go on, so generation ends by its limits."""
        if self.matcher.is_error():
            bitmask[row] = -1
        else:
            llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row)


class StructuredOutputManager:
    """Compiles the constraints of one engine's requests and fills their masks each step."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        # llguidance's index of the vocabulary, built at the first constrained request
        self._ll_tokenizer: Any = None

    def compile(self, constraint: StructuredOutputsParams) -> RequestGrammar:
        """The matcher of ``constraint``; RequestError naming the field when it is invalid."""
        if self.tokenizer is None:
            raise RequestError(
                "structured output needs a tokenizer; the engine runs with --skip-tokenizer-init",
                constraint.param,
            )
        grammar = grammar_for(constraint)
        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.vocab_size
            )
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar)
        if matcher.is_error():
            raise RequestError(
                f"{constraint.param}: invalid constraint: {matcher.get_error()}", constraint.param
            )
        return RequestGrammar(matcher)

    def grammar_bitmask(
        self, scheduler_output: SchedulerOutput, requests: dict[str, Request]
    ) -> GrammarBitmask | None:
        """The allowed tokens of the step's constrained rows, after every token each has. A row
        whose prefill chunk does not sample gets one too: cheaper than asking which rows do."""
        rows = [
            (i, request)
            for i, request_id in enumerate(scheduler_output.request_ids)
            if (request := requests[request_id]).grammar is not None
        ]
        if not rows:
            return None
        bitmask = llguidance.numpy.allocate_token_bitmask(len(rows), self.vocab_size)
        for row, (_, request) in enumerate(rows):
            assert request.grammar is not None
            request.grammar.catch_up(request.output_token_ids)
            request.grammar.fill(bitmask, row)
        return GrammarBitmask([i for i, _ in rows], bitmask)
