"""SamplingParams: how one request is sampled and when it stops (vLLM's fields and defaults)."""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

# Temperatures below this are greedy, as in vLLM.
SAMPLING_EPS = 1e-5

LogitsProcessor = Callable[[list[int], Any], Any]


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One request's output constraint, as plain data (vLLM's ``structured_outputs``): the engine
    core compiles it (``engine/structured_output.py``), so it crosses the pipe as what was asked.

    ``kind``: json | json_object | regex | choice | grammar (Lark or GBNF); ``spec``: the schema,
    pattern, choices or grammar text; ``param``: the request field it came from, which the error
    for a bad one names; ``compact``: JSON without free whitespace (None: no)."""

    kind: str
    spec: Any = None
    param: str = "structured_outputs"
    compact: bool | None = None


class RequestOutputKind(enum.Enum):
    """What each RequestOutput of a request carries."""

    CUMULATIVE = 0  # everything generated so far
    DELTA = 1  # only what is new since the last output (streaming)
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    logits_processors: list[LogitsProcessor] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's extra arguments for plugins and connectors: the --logits-processors classes read
    # theirs (vllm_xargs over HTTP), "kv_transfer_params" reaches the KV connector (a
    # disaggregated prefill's parameters, ``kv_transfer/nixl.py``)
    extra_args: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled by the engine from the model's generation config / tokenizer.
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == -1:  # vLLM's old spelling of "disabled"
            self.top_k = 0
        self._verify()
        self.all_stop_token_ids = set(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def _verify(self) -> None:
        def check(ok: bool, name: str, allowed: str, value: Any) -> None:
            if not ok:
                raise ValueError(f"{name} must be {allowed}, got {value!r}.")

        check(isinstance(self.n, int) and self.n >= 1, "n", "an integer >= 1", self.n)
        check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            "in [-2, 2]",
            self.presence_penalty,
        )
        check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            "in [-2, 2]",
            self.frequency_penalty,
        )
        check(
            0.0 < self.repetition_penalty < math.inf,
            "repetition_penalty",
            "a finite number > 0",
            self.repetition_penalty,
        )
        check(
            0.0 <= self.temperature < math.inf,
            "temperature",
            "a finite number >= 0",
            self.temperature,
        )
        check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)
        check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            "top_k",
            "0 or -1 (disabled) or a positive integer",
            self.top_k,
        )
        check(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]", self.min_p)
        check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            "max_tokens",
            "at least 1",
            self.max_tokens,
        )
        check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            "min_tokens",
            "an integer >= 0",
            self.min_tokens,
        )
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"less than or equal to max_tokens={self.max_tokens}",
            self.min_tokens,
        )
        check(
            self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
            "logprobs",
            "a non-negative integer",
            self.logprobs,
        )
        check(
            self.prompt_logprobs is None
            or (isinstance(self.prompt_logprobs, int) and self.prompt_logprobs >= 0),
            "prompt_logprobs",
            "a non-negative integer",
            self.prompt_logprobs,
        )
        check(
            all(isinstance(s, str) and s for s in self.stop or ()),
            "stop",
            "a non-empty string or a list of non-empty strings",
            self.stop,
        )
        check(
            all(isinstance(t, int) for t in self.stop_token_ids or ()),
            "stop_token_ids",
            "a list of integers",
            self.stop_token_ids,
        )
        check(self.seed is None or isinstance(self.seed, int), "seed", "an integer", self.seed)
        # -inf bans a token; NaN means nothing
        check(
            not any(math.isnan(v) for v in (self.logit_bias or {}).values()),
            "logit_bias",
            "numbers (not NaN)",
            self.logit_bias,
        )
        if self.allowed_token_ids is not None:
            check(
                len(self.allowed_token_ids) > 0,
                "allowed_token_ids",
                "a non-empty list",
                self.allowed_token_ids,
            )
        check(
            isinstance(self.output_kind, RequestOutputKind),
            "output_kind",
            "a RequestOutputKind",
            self.output_kind,
        )

    def clone(self) -> SamplingParams:
        # logits processors may hold state or unpicklable objects: share them, copy the rest.
        processors = self.logits_processors
        self.logits_processors = None
        try:
            copied = copy.deepcopy(self)
        finally:
            self.logits_processors = processors
        copied.logits_processors = processors
        return copied

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)} - {"all_stop_token_ids"}
