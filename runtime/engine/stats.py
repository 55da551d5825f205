"""Engine statistics, in one place, with vLLM v1's field names (the server exports them).

Each engine step produces a ``SchedulerStats`` (a snapshot of the queues and the KV cache) and an
``IterationStats`` (what happened in that step); stat loggers receive both via
``record(scheduler_stats, iteration_stats)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, Self

if TYPE_CHECKING:  # the API process reads these types without the engine's imports (torch)
    from infernetes.runtime.engine.request import Request


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the last snapshot: ``queries`` tokens looked up, ``hits`` found."""

    queries: int = 0
    hits: int = 0

    def take(self) -> Self:
        """Return the counts gathered so far and start again from zero."""
        taken = type(self)(self.queries, self.hits)
        self.queries, self.hits = 0, 0
        return taken


@dataclass
class MultiModalCacheStats(PrefixCacheStats):
    """Multimodal processor-cache lookups since the last snapshot, in items (vLLM's)."""


# KVTransfer.transfer_type of the NixlConnector's reads and notifications.
NIXL_READ = "NIXL_READ"
NIXL_NOTIFY = "NIXL_NOTIFY"


class KVTransfer(NamedTuple):
    """One copy a KV connector finished: its direction (vLLM's ``transfer_type``, "GPU_to_CPU"
    for a store, "CPU_to_GPU" for a load, whatever the device; NIXL_READ for the NixlConnector's
    read, NIXL_NOTIFY for its notification), its bytes over all ranks, and how long it took; a
    NIXL read also how long posting it took and its descriptors, or that it failed."""

    transfer_type: str
    num_bytes: int
    seconds: float
    post_seconds: float = 0.0
    num_descriptors: int = 0
    failed: bool = False


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction in [0, 1]
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    num_preemptions: int = 0  # preemptions in this step
    engine_index: int = 0  # which data-parallel engine core (the metrics' engine label)
    # requests per adapter name (vLLM's LoRAStats), for vllm:lora_requests_info
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    kv_events_dropped: int = 0  # KV-cache events dropped on the publisher's full queue
    kv_transfers: list[KVTransfer] = field(default_factory=list)  # reported since the last step


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
    n_param: int = 1
    time_to_first_token: float = 0.0
    model_forward_time: float = 0.0
    model_execute_time: float = 0.0


# computed here, found in the prefix cache, brought by a KV connector
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


@dataclass
class IterationStats:
    num_prompt_tokens: int = 0  # prompt tokens of the requests that got their first token
    # those prompt tokens by where their KV came from (vLLM's vllm:prompt_tokens_by_source)
    prompt_tokens_by_source: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(PROMPT_TOKEN_SOURCES, 0)
    )
    num_generation_tokens: int = 0  # tokens sampled this step
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    num_drafts: int = 0  # requests that verified drafts this step
    num_draft_tokens: int = 0  # draft tokens verified this step
    num_accepted_tokens: int = 0  # of those, the ones accepted
    # accepted drafts by their position in the draft (vLLM's per-position acceptance)
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # the multimodal processor cache's lookups since the last step, added on the API side where
    # the cache is (vLLM's mm_cache_stats); None when there is no cache
    mm_cache_stats: MultiModalCacheStats | None = None

    def count_prompt(self, num_prompt_tokens: int, num_cached: int, num_external: int) -> None:
        """A request's prompt, done: ``num_cached`` of its tokens were not computed here,
        ``num_external`` of those brought by a KV connector."""
        self.num_prompt_tokens += num_prompt_tokens
        by_source = self.prompt_tokens_by_source
        by_source["local_compute"] += num_prompt_tokens - num_cached
        by_source["local_cache_hit"] += num_cached - num_external
        by_source["external_kv_transfer"] += num_external

    def count_accepted(self, accepted: int, drafted: int) -> None:
        """One request's step accepted the first ``accepted`` of its ``drafted`` draft tokens
        (every drafted position is counted, accepted or not, as vLLM's vector is)."""
        self.num_accepted_tokens += accepted
        per_pos = self.num_accepted_tokens_per_pos
        per_pos.extend([0] * (max(accepted, drafted) - len(per_pos)))
        for position in range(accepted):
            per_pos[position] += 1


class StatLogger(Protocol):
    """What receives each step's statistics (the server's Prometheus and log loggers)."""

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None: ...


def finished_request_stats(request: Request) -> FinishedRequestStats:
    """The per-request histograms' values, when ``request`` ends (in any way)."""
    t = request.times
    end = t.finished or time.monotonic()
    scheduled = t.scheduled or end
    first = t.first_token or end
    last = t.last_token or end
    params = request.sampling_params
    return FinishedRequestStats(
        request_id=request.request_id,
        finish_reason=request.status.finish_reason or "abort",
        e2e_latency=end - t.arrival,
        num_prompt_tokens=request.num_prompt_tokens,
        num_generation_tokens=request.num_output_tokens,
        max_tokens_param=params.max_tokens if params else None,
        queued_time=scheduled - (t.queued or t.arrival),
        prefill_time=first - scheduled,
        inference_time=last - scheduled,
        decode_time=last - first,
        n_param=params.n if params else 1,
        time_to_first_token=first - t.arrival,
        model_forward_time=t.model_forward,
        model_execute_time=t.model_execute,
    )
