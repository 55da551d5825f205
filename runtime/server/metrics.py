"""Prometheus export of the engine's stats under vLLM's ``vllm:`` metric names.

``PrometheusStatLogger`` implements the engine's stat-logger seam: every engine step calls
``record(scheduler_stats, iteration_stats)``. Every series carries vLLM's ``model_name`` and
``engine`` labels; with ``--data-parallel-size`` each engine core's statistics go to its own
series (``SchedulerStats.engine_index``). Metrics live in a registry of their own so several
servers (tests) can run in one process. Deprecated metrics are registered only when
``--show-hidden-metrics-for-version`` names the version that deprecated them (vLLM's rule: a
metric deprecated in X.Y is hidden from X.Y+1 on, and ``=X.Y`` shows it again).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import prometheus_client
from infernetes.runtime.engine.stats import NIXL_NOTIFY, NIXL_READ, PROMPT_TOKEN_SOURCES
from infernetes.runtime.server.kv_transfer_metrics import KVTransferSeries, NixlSeries
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

if TYPE_CHECKING:
    from infernetes.runtime.engine.stats import IterationStats, SchedulerStats

# Version in which the deprecated metrics of reference chapter 7 were deprecated.
DEPRECATED_IN = "0.8"

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
TOKEN_LATENCY_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
MILLISECOND_BUCKETS = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
FINISH_REASONS = ("stop", "length", "abort")
# Every series says which model and which engine core (data-parallel rank) it counts.
ENGINE_LABELS = ["model_name", "engine"]

# Our own series stay exactly the reference's names: no "<name>_created" companions.
prometheus_client.disable_created_metrics()


def token_count_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len, as vLLM builds them."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return buckets
            buckets.append(value)
        exponent += 1


def show_hidden_metrics(requested_version: str | None) -> bool:
    if not requested_version:
        return False
    parts = requested_version.strip().lstrip("v").split(".")
    return ".".join(parts[:2]) == DEPRECATED_IN


class PrometheusStatLogger:
    """The series of every engine core, made as its statistics first arrive."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        cache_config: Mapping[str, Any] | None = None,
        show_hidden_metrics_for_version: str | None = None,
        registry: CollectorRegistry | None = None,
        engines: int = 1,
        max_loras: int = 0,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.max_loras = max_loras  # the lora_requests_info gauge's max_lora label
        self._settings = (model_name, max_model_len, cache_config, show_hidden_metrics_for_version)
        self._families: dict[str, Any] = {}
        # Every engine core's series exist from the start, at zero until it reports.
        self.engines = {index: EngineSeries(self, index) for index in range(engines)}

    def family(self, kind: type, name: str, doc: str, labels: list[str], **kwargs: Any) -> Any:
        """The metric family ``name``, made once for all engines. A gauge reads, across API
        processes (``--api-server-count``), as its most recent value: API process 0 sets it."""
        if kind is Gauge:
            kwargs.setdefault("multiprocess_mode", "mostrecent")
        if name not in self._families:
            self._families[name] = kind(name, doc, labels, registry=self.registry, **kwargs)
        return self._families[name]

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        index = scheduler_stats.engine_index if scheduler_stats is not None else 0
        if index not in self.engines:
            self.engines[index] = EngineSeries(self, index)
        self.engines[index].record(scheduler_stats, iteration_stats)

    def exposition(self) -> bytes:
        """The text format; with several API processes (PROMETHEUS_MULTIPROC_DIR, set by
        ``api_servers``), every process's series merged from their files."""
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not folder:
            return prometheus_client.generate_latest(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=folder)
        return prometheus_client.generate_latest(merged)


class EngineSeries:
    """One engine core's series (its ``engine`` label)."""

    def __init__(self, logger: PrometheusStatLogger, engine_index: int) -> None:
        model_name, max_model_len, cache_config, show_hidden_version = logger._settings
        self.model_name = model_name
        self.show_hidden = show_hidden_metrics(show_hidden_version)
        self._prefix_queries_seen = 0
        self._prefix_hits_seen = 0
        self._family = logger.family
        self._labels = (model_name, str(engine_index))
        self.kv_transfers: KVTransferSeries | None = None  # made at the first KV copy
        self.nixl: NixlSeries | None = None  # made at the first NIXL read
        tokens = token_count_buckets(max_model_len)
        self.running = self._gauge(
            "vllm:num_requests_running", "Number of requests currently running."
        )
        self.waiting = self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        # One series, labelled by the adapters of the running and waiting requests (vLLM's);
        # its value is when it was last set.
        self.lora_family = self._family(
            Gauge,
            "vllm:lora_requests_info",
            "Running stats on LoRA requests.",
            ["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
        )
        self.lora_labels = ("", "", str(logger.max_loras))
        self.lora_info = self.lora_family.labels(*self.lora_labels)
        self.kv_usage = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.gpu_cache_usage = self._gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens."
        )
        self.prefix_hits = self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        # the multimodal processor cache (--mm-processor-cache-gb); zero for a text model
        self.mm_cache_queries = self._counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        self.mm_cache_hits = self._counter(
            "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."
        )
        self.preemptions = self._counter(
            "vllm:num_preemptions", "Cumulative number of preemptions from the engine."
        )
        self.kv_events_dropped = self._counter(
            "vllm:kv_events_dropped",
            "KV-cache events dropped because the publisher's queue was full.",
        )
        self.prompt_tokens = self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        by_source = self._family(
            Counter,
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*ENGINE_LABELS, "source"],
        )
        self.prompt_tokens_by_source = {
            source: by_source.labels(*self._labels, source) for source in PROMPT_TOKEN_SOURCES
        }
        self.prompt_tokens_cached = self._counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local prefix cache and external KV transfer).",
        )
        self.iteration_tokens = self._histogram(
            "vllm:iteration_tokens_total",
            "Histogram of the number of tokens per engine step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.tpot = self._histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.itl = self._histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end-to-end request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = self._histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in the WAITING phase for a request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = self._histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in the RUNNING phase for a request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = self._histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in the PREFILL phase for a request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = self._histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in the DECODE phase for a request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prompt_tokens = self._histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed, per request.", tokens
        )
        self.request_generation_tokens = self._histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed, per request.",
            tokens,
        )
        self.request_max_generation_tokens = self._histogram(
            "vllm:request_max_num_generation_tokens",
            "Maximum number of requested generation tokens.",
            tokens,
        )
        self.request_n = self._histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20]
        )
        self.request_max_tokens = self._histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        success = self._family(
            Counter,
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*ENGINE_LABELS, "finished_reason"],
        )
        self.success = {reason: success.labels(*self._labels, reason) for reason in FINISH_REASONS}
        # Drafts (a request's step with drafts), draft tokens verified and accepted, as vLLM
        # V1 counts them; the V0-era rate, efficiency and emitted series exist (dashboards
        # expect them) and stay 0.
        self.drafts = self._counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts verified."
        )
        self._gauge("vllm:spec_decode_draft_acceptance_rate", "Speculative token acceptance rate.")
        self._gauge("vllm:spec_decode_efficiency", "Speculative decoding system efficiency.")
        self.accepted_tokens = self._counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
        )
        self.draft_tokens = self._counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
        )
        self.accepted_per_pos = self._family(
            Counter,
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*ENGINE_LABELS, "position"],
        )
        self._counter("vllm:spec_decode_num_emitted_tokens", "Number of emitted tokens.")
        info = {k: str(v) for k, v in (cache_config or {}).items()}
        cache_info = self._family(
            Gauge,
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            sorted(info),
        )
        (cache_info.labels(**info) if info else cache_info).set(1)
        self.lora_info.set(time.time())
        self.hidden: dict[str, Any] = self._deprecated_series() if self.show_hidden else {}

    def _gauge(self, name: str, doc: str) -> Gauge:
        """This engine's series of the gauge ``name``."""
        return self._family(Gauge, name, doc, ENGINE_LABELS).labels(*self._labels)

    def _counter(self, name: str, doc: str) -> Counter:
        return self._family(Counter, name, doc, ENGINE_LABELS).labels(*self._labels)

    def _histogram(self, name: str, doc: str, buckets: list) -> Histogram:
        return self._family(Histogram, name, doc, ENGINE_LABELS, buckets=buckets).labels(
            *self._labels
        )

    def _deprecated_series(self) -> dict[str, Any]:
        """The series deprecated in DEPRECATED_IN, by what records them."""
        return {
            "swapped": self._gauge(
                "vllm:num_requests_swapped",
                "Number of requests swapped to CPU. Deprecated: KV cache offloading is not used.",
            ),
            "cpu_cache": self._gauge(
                "vllm:cpu_cache_usage_perc",
                "CPU KV-cache usage. Deprecated: KV cache offloading is not used.",
            ),
            "cpu_prefix_rate": self._gauge(
                "vllm:cpu_prefix_cache_hit_rate",
                "CPU prefix cache block hit rate. Deprecated: KV cache offloading is not used.",
            ),
            "gpu_prefix_rate": self._gauge(
                "vllm:gpu_prefix_cache_hit_rate",
                "GPU prefix cache block hit rate. Deprecated: use vllm:prefix_cache_queries and vllm:prefix_cache_hits.",
            ),
            "time_in_queue": self._histogram(
                "vllm:time_in_queue_requests",
                "Time the request spent in the queue in seconds. Deprecated: use vllm:request_queue_time_seconds.",
                REQUEST_LATENCY_BUCKETS,
            ),
            "forward_ms": self._histogram(
                "vllm:model_forward_time_milliseconds",
                "Time spent in the model forward pass in milliseconds. Deprecated: use prefill/decode/inference time metrics.",
                MILLISECOND_BUCKETS,
            ),
            "execute_ms": self._histogram(
                "vllm:model_execute_time_milliseconds",
                "Time spent in the model execute function in milliseconds. Deprecated: use prefill/decode/inference time metrics.",
                MILLISECOND_BUCKETS,
            ),
        }

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if scheduler_stats is not None:
            self._record_scheduler(scheduler_stats)
        if iteration_stats is not None:
            self._record_iteration(iteration_stats)

    def _record_scheduler(self, stats: SchedulerStats) -> None:
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        self.gpu_cache_usage.set(stats.kv_cache_usage)
        self.preemptions.inc(stats.num_preemptions)
        self.kv_events_dropped.inc(stats.kv_events_dropped)
        nixl = [t for t in stats.kv_transfers if t.transfer_type in (NIXL_READ, NIXL_NOTIFY)]
        copies = [t for t in stats.kv_transfers if t.transfer_type not in (NIXL_READ, NIXL_NOTIFY)]
        if copies:
            if self.kv_transfers is None:
                self.kv_transfers = KVTransferSeries(self._family, ENGINE_LABELS, self._labels)
            self.kv_transfers.record(copies)
        if nixl:
            if self.nixl is None:
                self.nixl = NixlSeries(self._family, ENGINE_LABELS, self._labels)
            self.nixl.record(nixl)
        self._record_lora(stats)
        prefix = stats.prefix_cache_stats
        self.prefix_queries.inc(prefix.queries)
        self.prefix_hits.inc(prefix.hits)
        self._prefix_queries_seen += prefix.queries
        self._prefix_hits_seen += prefix.hits
        if self.hidden and self._prefix_queries_seen:
            self.hidden["gpu_prefix_rate"].set(self._prefix_hits_seen / self._prefix_queries_seen)

    def _record_lora(self, stats: SchedulerStats) -> None:
        labels = (
            ",".join(sorted(stats.running_lora_adapters)),
            ",".join(sorted(stats.waiting_lora_adapters)),
            self.lora_labels[2],
        )
        if labels != self.lora_labels:
            self.lora_family.remove(*self.lora_labels)
            self.lora_labels = labels
            self.lora_info = self.lora_family.labels(*labels)
        self.lora_info.set(time.time())

    def _record_iteration(self, stats: IterationStats) -> None:
        self.prompt_tokens.inc(stats.num_prompt_tokens)
        for source, num_tokens in stats.prompt_tokens_by_source.items():
            self.prompt_tokens_by_source[source].inc(num_tokens)
        by_source = stats.prompt_tokens_by_source
        self.prompt_tokens_cached.inc(
            by_source["local_cache_hit"] + by_source["external_kv_transfer"]
        )
        self.generation_tokens.inc(stats.num_generation_tokens)
        if stats.mm_cache_stats is not None:
            self.mm_cache_queries.inc(stats.mm_cache_stats.queries)
            self.mm_cache_hits.inc(stats.mm_cache_stats.hits)
        self.drafts.inc(stats.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens)
        self.accepted_tokens.inc(stats.num_accepted_tokens)
        for position, accepted in enumerate(stats.num_accepted_tokens_per_pos):
            self.accepted_per_pos.labels(*self._labels, str(position)).inc(accepted)
        step_tokens = stats.num_prompt_tokens + stats.num_generation_tokens
        if step_tokens:
            self.iteration_tokens.observe(step_tokens)
        for ttft in stats.time_to_first_tokens_iter:
            self.ttft.observe(ttft)
        for itl in stats.inter_token_latencies_iter:
            self.itl.observe(itl)
            self.tpot.observe(itl)
        for finished in stats.finished_requests:
            reason = str(finished.finish_reason).lower().rsplit(".", 1)[-1]
            self.success.get(reason, self.success["abort"]).inc()
            self.e2e.observe(finished.e2e_latency)
            self.queue_time.observe(finished.queued_time)
            self.prefill_time.observe(finished.prefill_time)
            self.decode_time.observe(finished.decode_time)
            self.inference_time.observe(finished.inference_time)
            self.request_prompt_tokens.observe(finished.num_prompt_tokens)
            self.request_generation_tokens.observe(finished.num_generation_tokens)
            self.request_max_generation_tokens.observe(finished.num_generation_tokens)
            if finished.max_tokens_param is not None:
                self.request_max_tokens.observe(finished.max_tokens_param)
            self.request_n.observe(finished.n_param)
            if self.hidden:
                self.hidden["time_in_queue"].observe(finished.queued_time)
