"""Structured output in the engine core (vLLM V1's ``v1/structured_output/``), through the
engine's backend: xgrammar or guidance (llguidance), or "auto", vLLM's default: xgrammar, and
guidance for a constraint xgrammar cannot take (not with ``disable_fallback``)
(``xgrammar_backend.py``, ``guidance_backend.py``).

A request's constraint (``SamplingParams.structured_outputs``) is compiled once, here: the input
processor has ``StructuredOutputManager.compile`` build its matcher over the core's tokenizer,
whose index the backend builds once per engine. Each
sequence of the request (``n > 1``) gets its own copy of that matcher (``RequestGrammar``),
advanced with every token the request accepts. Each step the manager fills the allowed-token
bitmask of the constrained rows (``GrammarBitmask``), which the workers get with the step and
apply to the logits before sampling: they never see a grammar or a tokenizer. A request with
draft tokens gets a mask for each position it samples (vLLM's way): after its tokens, then after
each draft in turn, the matcher advanced through the drafts and rolled back.

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

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.engine.request import Request
from infernetes.runtime.engine.scheduler_output import (
    CachedRequestData,
    GrammarBitmask,
    SchedulerOutput,
)
from infernetes.runtime.sampling_params import StructuredOutputsParams


class Matcher(Protocol):
    """One sequence's matcher, as each backend wraps its own."""

    def fork(self) -> Matcher: ...
    def is_stopped(self) -> bool: ...
    def accept(self, token: int) -> None: ...
    def try_accept(self, token: int) -> bool:
        """Accept ``token`` if the grammar allows it here; else change nothing."""
        ...

    def rollback(self, num_tokens: int) -> None: ...
    def fill(self, bitmask: np.ndarray, row: int) -> None: ...


class RequestGrammar:
    """One sequence's matcher and how many of its output tokens it has consumed."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.num_consumed = 0

    def copy(self) -> RequestGrammar:
        """A fresh sequence's matcher, without compiling again (``n > 1``)."""
        return RequestGrammar(self.matcher.fork())

    def catch_up(self, output_token_ids: Sequence[int]) -> None:
        """Consume the tokens the request accepted since the last call. A request's tokens only
        grow (a preempted one keeps its own), so the count is all the state needed."""
        for token in output_token_ids[self.num_consumed :]:
            if not self.matcher.is_stopped():  # past the end: EOS, or tokens ignore_eos kept
                self.matcher.accept(token)
        self.num_consumed = len(output_token_ids)

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Row ``row`` of ``bitmask``: the tokens the grammar allows next (only EOS once it is
        complete); every token when it cannot go on, so generation ends by its limits."""
        self.matcher.fill(bitmask, row)

    def fill_with_drafts(self, bitmask: np.ndarray, row: int, drafts: Sequence[int]) -> None:
        """Rows ``row`` to ``row + len(drafts)``: the tokens allowed after the request's tokens,
        then after each draft as if those before it were kept. Past a draft the grammar refuses,
        every token: its position cannot sample it, so no later sample is kept."""
        self.fill(bitmask, row)
        advanced = 0
        for offset, draft in enumerate(drafts, start=1):
            if advanced == offset - 1 and self.matcher.try_accept(draft):
                advanced += 1
                self.fill(bitmask, row + offset)
            else:
                bitmask[row + offset] = -1
        if advanced:
            self.matcher.rollback(advanced)


class StructuredOutputManager:
    """Compiles the constraints of one engine's requests and fills their masks each step."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, backend: str = "auto", fallback: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.backend = backend
        self.fallback = fallback
        # Each backend's index of the vocabulary, built when first used.
        self._compilers: dict[str, Any] = {}

    def compile(self, constraint: StructuredOutputsParams) -> RequestGrammar:
        """The matcher of ``constraint``; RequestError naming the field when it is invalid."""
        if self.tokenizer is None:
            raise RequestError(
                "structured output needs a tokenizer; the engine runs with --skip-tokenizer-init",
                constraint.param,
            )
        if self.backend != "auto":
            return RequestGrammar(self._compiler(self.backend).compile(constraint))
        try:
            return RequestGrammar(self._compiler("xgrammar").compile(constraint))
        except RequestError:
            if not self.fallback:
                raise
        return RequestGrammar(self._compiler("guidance").compile(constraint))

    def _compiler(self, backend: str) -> Any:
        if backend not in self._compilers:
            # Imported here: an engine loads only the backends it uses.
            if backend == "xgrammar":
                from infernetes.runtime.engine.xgrammar_backend import XgrammarCompiler

                self._compilers[backend] = XgrammarCompiler(self.tokenizer, self.vocab_size)
            else:
                from infernetes.runtime.engine.guidance_backend import GuidanceCompiler

                self._compilers[backend] = GuidanceCompiler(self.tokenizer, self.vocab_size)
        return self._compilers[backend]

    def grammar_bitmask(
        self, scheduler_output: SchedulerOutput, requests: dict[str, Request]
    ) -> GrammarBitmask | None:
        """The allowed tokens of the step's constrained rows, after every token each has (and
        after each of its drafts). A row whose prefill chunk does not sample gets one too:
        cheaper than asking which rows do."""
        rows = [
            (i, request, data.spec_token_ids if isinstance(data, CachedRequestData) else [])
            for i, data in enumerate(scheduler_output.scheduled_reqs)
            if (request := requests[data.request_id]).grammar is not None
        ]
        if not rows:
            return None
        # 32 tokens a word, bit set = allowed: llguidance's and xgrammar's layout alike
        num_rows = sum(1 + len(drafts) for _, _, drafts in rows)
        bitmask = np.zeros((num_rows, (self.vocab_size + 31) // 32), dtype=np.int32)
        batch_rows: list[int] = []
        for i, request, drafts in rows:
            assert request.grammar is not None
            request.grammar.catch_up(request.output_token_ids)
            request.grammar.fill_with_drafts(bitmask, len(batch_rows), drafts)
            batch_rows += [i] * (1 + len(drafts))
        return GrammarBitmask(batch_rows, bitmask)
