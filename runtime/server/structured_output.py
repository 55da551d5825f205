"""Structured output (JSON schema, regex, choice, grammar) through llguidance.

A request's constraint becomes an llguidance grammar; ``GrammarLogitsProcessor`` plugs into
``SamplingParams.logits_processors``: before each sampling step it feeds the matcher the tokens
generated since the last call and masks every token the grammar does not allow.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance

if TYPE_CHECKING:
    import torch

# --guided-decoding-backend values: ours is llguidance ("guidance"); "auto" means it too.
SUPPORTED_BACKENDS = ("auto", "guidance")


class GuideError(ValueError):
    """A constraint that cannot be compiled; the message names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Guide:
    """One request's constraint: ``kind`` is json | regex | choice | grammar | json_object."""

    kind: str
    spec: Any
    param: str
    compact: bool | None = None  # the request's disable_any_whitespace; None: the server's


def check_backend(name: str | None, param: str = "guided_decoding_backend") -> None:
    if name is None:
        return
    backend = name.split(":", 1)[0]
    if backend not in SUPPORTED_BACKENDS:
        raise GuideError(
            f"{param} {backend!r} is not supported yet; supported: {', '.join(SUPPORTED_BACKENDS)}",
            param,
        )


def _schema_with_options(schema: Any, param: str, compact: bool) -> dict:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise GuideError(f"{param} is not valid JSON: {exc}", param) from exc
    if not isinstance(schema, dict):
        raise GuideError(f"{param} must be a JSON object (a JSON schema)", param)
    if compact:
        schema = {
            **schema,
            "x-guidance": {**schema.get("x-guidance", {}), "whitespace_flexible": False},
        }
    return schema


def grammar_for(guide: Guide, compact_json: bool = False) -> str:
    """The llguidance grammar (a JSON string) for ``guide``; raises GuideError if invalid."""
    matcher = llguidance.LLMatcher
    try:
        if guide.kind in ("json", "json_object"):
            schema = {"type": "object"} if guide.kind == "json_object" else guide.spec
            grammar = matcher.grammar_from_json_schema(
                _schema_with_options(schema, guide.param, compact_json)
            )
        elif guide.kind == "regex":
            grammar = matcher.grammar_from_regex(guide.spec)
        elif guide.kind == "choice":
            grammar = llguidance.grammar_from("choice", json.dumps([str(c) for c in guide.spec]))
        elif guide.kind == "grammar":
            # Lark or GBNF (llama.cpp's, as vLLM's guided_grammar accepts): llguidance tells them apart.
            grammar = llguidance.grammar_from("grammar", guide.spec)
        else:
            raise GuideError(f"unknown structured-output kind {guide.kind!r}", guide.param)
    except GuideError:
        raise
    except Exception as exc:  # llguidance raises ValueError/RuntimeError on bad input
        raise GuideError(f"{guide.param}: invalid constraint: {exc}", guide.param) from exc
    is_error, messages = matcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GuideError(
            f"{guide.param}: invalid constraint: {'; '.join(map(str, messages))}", guide.param
        )
    return grammar


class TokenizerIndex:
    """llguidance's view of one HF tokenizer, built once (it walks the whole vocabulary)."""

    _cache: dict[tuple[int, int], Any] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, tokenizer: Any, vocab_size: int) -> Any:
        import llguidance.hf  # transformers: loaded with the tokenizer, not before serve starts

        key = (id(tokenizer), vocab_size)
        with cls._lock:
            if key not in cls._cache:
                cls._cache[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
            return cls._cache[key]


class GrammarLogitsProcessor:
    """Masks logits to what the grammar allows next, for every sequence of one request.

    The engine calls it with each sequence's output so far. Matchers are kept by that output, so
    ``n > 1`` sequences that diverge each get their own (copied from the common prefix), and a
    preempted sequence recomputed from scratch finds its state again.
    """

    def __init__(
        self,
        ll_tokenizer: Any,
        grammar: str,
        vocab_size: int,
        eos_token_id: int | None,
        tokenizer_source: str | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.grammar = grammar
        self.tokenizer_source = tokenizer_source
        root = llguidance.LLMatcher(ll_tokenizer, grammar)
        if root.is_error():
            raise GuideError(f"invalid constraint: {root.get_error()}", "response_format")
        self.states: dict[tuple[int, ...], Any] = {(): root}
        # Made at the first call, where the logits are (the engine core): the API process, which
        # compiles the grammar, never imports torch (llguidance.torch pulls in torch._dynamo).
        self.bitmask: torch.Tensor | None = None

    def __reduce__(self) -> tuple:
        # Crossing to the engine-core process: the grammar goes, the matchers are rebuilt there
        # on the engine's own tokenizer.
        return (
            _rebuild_processor,
            (self.grammar, self.vocab_size, self.eos_token_id, self.tokenizer_source),
        )

    def _matcher_for(self, tokens: tuple[int, ...]) -> Any:
        if tokens in self.states:
            return self.states[tokens]
        parent = tokens[:-1]
        if parent and parent in self.states:
            matcher = self.states.pop(parent)  # this sequence moved on by one token
            start = len(parent)
        else:
            # A new or diverged sequence: copy the longest known prefix (at least the root,
            # which is never advanced in place) and replay the rest.
            prefix = max((k for k in self.states if tokens[: len(k)] == k), key=len)
            matcher = self.states[prefix].deep_copy()
            start = len(prefix)
        for token in tokens[start:]:
            if not matcher.is_stopped():
                matcher.consume_token(token)
        self.states[tokens] = matcher
        return matcher

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        import llguidance.torch
        import torch

        matcher = self._matcher_for(tuple(output_token_ids))
        if matcher.is_error():
            return logits  # the grammar cannot continue; let generation end by its limits
        if matcher.is_stopped():
            allowed = torch.full_like(logits, float("-inf"))
            if self.eos_token_id is not None and self.eos_token_id < logits.shape[-1]:
                allowed[self.eos_token_id] = 0.0
            return logits + allowed
        if self.bitmask is None:
            self.bitmask = llguidance.torch.allocate_token_bitmask(1, self.vocab_size)
        llguidance.torch.fill_next_token_bitmask(matcher, self.bitmask, 0)
        masked = logits.float().unsqueeze(0).clone()
        llguidance.torch.apply_token_bitmask_inplace(masked, self.bitmask)
        return masked.squeeze(0).to(logits.dtype)


def _rebuild_processor(
    grammar: str, vocab_size: int, eos_token_id: int | None, tokenizer_source: str | None
) -> GrammarLogitsProcessor:
    from infernetes.runtime.engine.core_client import process_tokenizer

    tokenizer = process_tokenizer()
    if tokenizer is None:  # not an engine process: load the tokenizer the API side named
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    try:
        return GrammarLogitsProcessor(
            TokenizerIndex.get(tokenizer, vocab_size),
            grammar,
            vocab_size,
            eos_token_id,
            tokenizer_source,
        )
    except GuideError as exc:  # a plain ValueError pickles back to the API side
        raise ValueError(str(exc)) from None


def make_logits_processor(
    guide: Guide, tokenizer: Any, vocab_size: int, compact_json: bool = False
) -> GrammarLogitsProcessor:
    grammar = grammar_for(guide, compact_json)
    index = TokenizerIndex.get(tokenizer, vocab_size)
    return GrammarLogitsProcessor(
        index, grammar, vocab_size, tokenizer.eos_token_id, getattr(tokenizer, "name_or_path", None)
    )
