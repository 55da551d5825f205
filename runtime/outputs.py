"""What the engine returns: RequestOutput / CompletionOutput / PoolingRequestOutput (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: {token_id: Logprob}; a prompt's first position is None.
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class RequestMetrics:
    """Timestamps (``time.time()``) of one request's life, as vLLM reports them."""

    arrival_time: float
    last_token_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    time_in_queue: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    # what the KV connector says another engine needs to fetch its blocks (the final output)
    kv_transfer_params: dict[str, Any] | None = None

    def followed_by(self, later: RequestOutput, delta: bool) -> RequestOutput:
        """This output and the next one of the same request as one: the later one where outputs
        are cumulative; with ``delta`` outputs, each sample's new text, tokens and logprobs
        joined (the later's finish and cumulative logprob)."""
        if not delta:
            return later
        joined = {c.index: c for c in self.outputs}
        for c in later.outputs:
            before = joined.get(c.index)
            if before is not None:
                logprobs = (
                    before.logprobs + c.logprobs
                    if before.logprobs is not None and c.logprobs is not None
                    else c.logprobs
                )
                c = replace(
                    c,
                    text=before.text + c.text,
                    token_ids=before.token_ids + c.token_ids,
                    logprobs=logprobs,
                )
            joined[c.index] = c
        prompt_logprobs = (
            self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs
        )
        return replace(later, prompt_logprobs=prompt_logprobs, outputs=list(joined.values()))


@dataclass
class PoolingOutput:
    data: Any  # a 1-D float tensor

    @property
    def embedding(self) -> list[float]:
        return self.data.tolist()


@dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    prompt: str | None = None
    metrics: RequestMetrics | None = field(default=None, repr=False)
