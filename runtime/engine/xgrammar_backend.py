"""The xgrammar backend of structured output (``--structured-outputs-config
'{"backend": "xgrammar"}'``, vLLM's default), as vLLM's compiles each kind: a JSON schema with
``any_whitespace`` unless whitespace is disabled, a regex, an EBNF (GBNF) or Lark grammar, a
choice as an EBNF alternation. ``VLLM_XGRAMMAR_CACHE_MB`` bounds the compiled-grammar cache.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xgrammar
from infernetes.runtime.engine.ascii_classes import ascii_classes, ascii_schema_patterns
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.sampling_params import StructuredOutputsParams
from infernetes.runtime.tokenization.mistral import MistralTokenizer

from infernetes.schema.env import read_env


def _schema(constraint: StructuredOutputsParams) -> dict[str, Any]:
    schema = {"type": "object"} if constraint.kind == "json_object" else constraint.spec
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise RequestError(
                f"{constraint.param} is not valid JSON: {exc}", constraint.param
            ) from exc
    if not isinstance(schema, dict):
        raise RequestError(
            f"{constraint.param} must be a JSON object (a JSON schema)", constraint.param
        )
    return ascii_schema_patterns(schema)


# JSON-schema keywords xgrammar compiles without enforcing (vLLM's list): refused here, so
# "auto" takes such a schema to guidance instead of producing JSON that breaks it.
UNENFORCED_KEYWORDS = frozenset(
    {
        "multipleOf",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "patternProperties",
        "propertyNames",
    }
)


def unenforced_keywords(schema: Any) -> set[str]:
    """The UNENFORCED_KEYWORDS anywhere in ``schema``."""
    found: set[str] = set()
    if isinstance(schema, dict):
        found |= UNENFORCED_KEYWORDS & schema.keys()
        for value in schema.values():
            found |= unenforced_keywords(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= unenforced_keywords(item)
    return found


def choice_grammar(choices: list[Any]) -> str:
    """The EBNF of exactly one of ``choices`` (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(str(c), ensure_ascii=False) for c in choices)


class XgrammarMatcher:
    """One sequence's xgrammar matcher. xgrammar has no error state: a token it refuses (none
    can be sampled under its mask) leaves it unable to go on, and then every token is allowed,
    so the request ends by its limits, as under guidance."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.failed = False

    def fork(self) -> XgrammarMatcher:
        return XgrammarMatcher(self.compiled)

    def is_stopped(self) -> bool:
        return self.failed or self.matcher.is_terminated()

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            self.failed = True

    def try_accept(self, token: int) -> bool:
        # xgrammar leaves its state as it was when it refuses a token
        return not self.is_stopped() and self.matcher.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        # after its stop token (a draft's) the request ends: whatever follows is not kept
        if self.failed or self.matcher.is_terminated():
            bitmask[row] = -1
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)


def _mistral_info(tokenizer: MistralTokenizer, vocab_size: int) -> Any:
    """xgrammar's view of a Tekken vocabulary: raw bytes, special tokens empty (xgrammar then
    takes them for special ones, never text), EOS the stop token."""
    return xgrammar.TokenizerInfo(
        tokenizer.token_bytes(),
        vocab_type=xgrammar.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=[tokenizer.eos_token_id],
    )


class XgrammarCompiler:
    """Compiles constraints over one tokenizer (its xgrammar index is built once)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        info = (
            _mistral_info(tokenizer, vocab_size)
            if isinstance(tokenizer, MistralTokenizer)
            else xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        )
        cache_mb = read_env("VLLM_XGRAMMAR_CACHE_MB")
        self.compiler = xgrammar.GrammarCompiler(info, cache_limit_bytes=cache_mb * 1024 * 1024)

    def compile(self, constraint: StructuredOutputsParams) -> XgrammarMatcher:
        kind, spec = constraint.kind, constraint.spec
        try:
            if kind in ("json", "json_object"):
                schema = _schema(constraint)
                if unenforced := unenforced_keywords(schema):
                    raise RequestError(
                        f"{constraint.param}: the xgrammar backend does not enforce "
                        f"{', '.join(sorted(unenforced))}; use the guidance backend (or auto)",
                        constraint.param,
                    )
                # Without whitespace means none: xgrammar's own default keeps a space after
                # ',' and ':', guidance's and the flag's description none.
                compiled = self.compiler.compile_json_schema(
                    json.dumps(schema),
                    any_whitespace=not constraint.compact,
                    separators=(",", ":") if constraint.compact else None,
                )
            elif kind == "regex":
                compiled = self.compiler.compile_regex(ascii_classes(spec))
            elif kind == "choice":
                compiled = self.compiler.compile_grammar(choice_grammar(list(spec)))
            elif kind == "grammar":
                # GBNF/EBNF rules are `name ::= ...`; anything else is taken as Lark, as vLLM does.
                compiled = (
                    self.compiler.compile_grammar(spec)
                    if "::=" in spec
                    else self.compiler.compile_lark(spec)
                )
            else:
                raise RequestError(f"unknown structured-output kind {kind!r}", constraint.param)
        except RequestError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError on bad input
            raise RequestError(
                f"{constraint.param}: invalid constraint: {exc}", constraint.param
            ) from exc
        return XgrammarMatcher(compiled)
