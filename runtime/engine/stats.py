"""Engine statistics, in one place, with vLLM v1's field names (the server exports them).

Each engine step produces a ``SchedulerStats`` (a snapshot of the queues and the KV cache) and an
``IterationStats`` (what happened in that step); stat loggers receive both via
``record(scheduler_stats, iteration_stats)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the last snapshot: ``queries`` tokens looked up, ``hits`` found."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0

    def take(self) -> PrefixCacheStats:
        """Return the counts gathered so far and start again from zero."""
        taken = PrefixCacheStats(self.reset, self.requests, self.queries, self.hits)
        self.reset, self.requests, self.queries, self.hits = False, 0, 0, 0
        return taken


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction in [0, 1]
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    num_preemptions: int = 0  # preemptions in this step
    num_kv_cache_blocks: int = 0
    block_size: int = 0

    @property
    def gpu_cache_usage(self) -> float:  # vLLM v0's name
        return self.kv_cache_usage


@dataclass
class FinishedRequestStats:
    request_id: str
    finish_reason: str  # "stop" | "length" | "abort"
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: int | None = None
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    decode_time: float = 0.0
    mean_time_per_output_token: float = 0.0
    n_param: int = 1
    num_cached_tokens: int = 0


@dataclass
class IterationStats:
    iteration_timestamp: float = field(default_factory=time.time)
    num_prompt_tokens: int = 0  # prompt tokens computed this step (prefill chunks)
    num_generation_tokens: int = 0  # tokens sampled this step
    num_preempted_reqs: int = 0
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    time_per_output_tokens_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    n_params_iter: list[int] = field(default_factory=list)  # n of requests that got a first token
    max_num_generation_tokens_iter: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens this iteration processed (``vllm:iteration_tokens_total``)."""
        return self.num_prompt_tokens + self.num_generation_tokens
