"""The Prometheus exporter: every vLLM metric name, hidden deprecated ones, counters that move."""

from __future__ import annotations

import json
from pathlib import Path

from infernetes.runtime.engine.stats import (
    FinishedRequestStats,
    IterationStats,
    MultiModalCacheStats,
    PrefixCacheStats,
    SchedulerStats,
)
from infernetes.runtime.server.metrics import PrometheusStatLogger, token_count_buckets
from prometheus_client.parser import text_string_to_metric_families

NAMES = json.loads((Path(__file__).parent / "data" / "vllm_metrics.json").read_text())


def exposed(logger: PrometheusStatLogger) -> dict[str, dict]:
    """{sample name: {labels-tuple: value}} of the exposition text."""
    samples: dict[str, dict] = {}
    for family in text_string_to_metric_families(logger.exposition().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def family_names(logger: PrometheusStatLogger) -> set[str]:
    names = set()
    for sample_name in exposed(logger):
        names.add(sample_name)
        for suffix in ("_bucket", "_sum", "_count"):
            if sample_name.endswith(suffix):
                names.add(sample_name[: -len(suffix)])
    return names


def test_every_current_metric_is_exposed_with_model_name():
    logger = PrometheusStatLogger("tiny", 512, {"block_size": 16, "enable_prefix_caching": True})
    names = family_names(logger)
    for name in NAMES["chapter6_current"] + NAMES["v1_additions"]:
        assert name in names, name
    for name in NAMES["chapter7_deprecated"]:
        assert name not in names, name
    running = exposed(logger)["vllm:num_requests_running"]
    assert (("engine", "0"), ("model_name", "tiny")) in running
    cache_info = exposed(logger)["vllm:cache_config_info"]
    assert any(("block_size", "16") in labels for labels in cache_info)


def test_hidden_metrics_come_back_for_their_version():
    assert not {n for n in NAMES["chapter7_deprecated"]} & family_names(
        PrometheusStatLogger("tiny", 512, show_hidden_metrics_for_version="0.7")
    )
    names = family_names(PrometheusStatLogger("tiny", 512, show_hidden_metrics_for_version="0.8"))
    for name in NAMES["chapter7_deprecated"]:
        assert name in names, name


def test_record_moves_counters_and_gauges():
    logger = PrometheusStatLogger("tiny", 512, show_hidden_metrics_for_version="0.8")
    scheduler = SchedulerStats(
        num_running_reqs=3,
        num_waiting_reqs=1,
        kv_cache_usage=0.25,
        prefix_cache_stats=PrefixCacheStats(queries=32, hits=16),
        num_preemptions=2,
    )
    iteration = IterationStats(
        num_prompt_tokens=20,
        num_generation_tokens=4,
        num_drafts=2,
        num_draft_tokens=6,
        num_accepted_tokens=4,
        num_accepted_tokens_per_pos=[2, 1, 1],
        time_to_first_tokens_iter=[0.05],
        inter_token_latencies_iter=[0.01, 0.02],
        finished_requests=[
            FinishedRequestStats(
                "r1",
                "length",
                e2e_latency=0.5,
                num_prompt_tokens=20,
                num_generation_tokens=4,
                max_tokens_param=4,
                queued_time=0.01,
                prefill_time=0.05,
                inference_time=0.4,
                decode_time=0.35,
            )
        ],
    )
    logger.record(scheduler, iteration)
    logger.record(SchedulerStats(prefix_cache_stats=PrefixCacheStats(queries=16, hits=16)), None)
    m = exposed(logger)
    label = (("engine", "0"), ("model_name", "tiny"))
    assert m["vllm:num_requests_running"][label] == 0  # the last snapshot
    assert m["vllm:prompt_tokens_total"][label] == 20
    assert m["vllm:generation_tokens_total"][label] == 4
    assert m["vllm:spec_decode_num_drafts_total"][label] == 2
    assert m["vllm:spec_decode_num_draft_tokens_total"][label] == 6
    assert m["vllm:spec_decode_num_accepted_tokens_total"][label] == 4
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert [per_pos[(*label, ("position", str(p)))] for p in range(3)] == [2, 1, 1]
    assert m["vllm:prefix_cache_queries_total"][label] == 48
    assert m["vllm:prefix_cache_hits_total"][label] == 32
    assert m["vllm:gpu_prefix_cache_hit_rate"][label] == 32 / 48
    assert m["vllm:num_preemptions_total"][label] == 2
    assert (
        m["vllm:request_success_total"][
            (("engine", "0"), ("finished_reason", "length"), ("model_name", "tiny"))
        ]
        == 1
    )
    assert m["vllm:time_to_first_token_seconds_count"][label] == 1
    assert m["vllm:inter_token_latency_seconds_count"][label] == 2
    assert m["vllm:e2e_request_latency_seconds_sum"][label] == 0.5
    assert m["vllm:iteration_tokens_total_count"][label] == 1


def test_token_buckets():
    assert token_count_buckets(100) == [1, 2, 5, 10, 20, 50, 100]


def test_each_data_parallel_engine_has_its_own_series():
    from infernetes.runtime.engine.stats import IterationStats, SchedulerStats

    logger = PrometheusStatLogger("tiny", 512)
    logger.record(SchedulerStats(num_running_reqs=1, engine_index=0), IterationStats())
    logger.record(SchedulerStats(num_running_reqs=3, engine_index=1), IterationStats())
    running = exposed(logger)["vllm:num_requests_running"]
    assert running[(("engine", "0"), ("model_name", "tiny"))] == 1
    assert running[(("engine", "1"), ("model_name", "tiny"))] == 3


def test_the_stats_log_has_vllms_spec_decoding_line(caplog):
    """Two requests' steps drafted 3 tokens each; one accepted 2, the other 1."""
    from infernetes.runtime.engine.stats import IterationStats
    from infernetes.runtime.server.log_stats import LoggingStatLogger

    stats = LoggingStatLogger(interval_s=0.0)
    iteration = IterationStats(num_drafts=2, num_draft_tokens=6)
    iteration.count_accepted(2, 3)
    iteration.count_accepted(1, 3)
    assert iteration.num_accepted_tokens == 3
    assert iteration.num_accepted_tokens_per_pos == [2, 1, 0]
    with caplog.at_level("INFO", logger="infernetes.runtime.server.stats"):
        stats.record(None, iteration)
    line = next(r.message for r in caplog.records if r.message.startswith("SpecDecoding"))
    assert "Mean acceptance length: 2.50" in line
    assert "Accepted: 3 tokens, Drafted: 6 tokens" in line
    assert "Per-position acceptance rate: 1.000, 0.500, 0.000" in line
    assert "Avg Draft acceptance rate: 50.0%" in line


def test_multimodal_cache_counters_in_items():
    logger = PrometheusStatLogger("tiny", 512)
    label = (("engine", "0"), ("model_name", "tiny"))
    m = exposed(logger)
    # registered from the start, as vLLM's, zero for a text model
    assert m["vllm:mm_cache_queries_total"][label] == m["vllm:mm_cache_hits_total"][label] == 0
    logger.record(None, IterationStats(mm_cache_stats=MultiModalCacheStats(queries=3, hits=1)))
    logger.record(None, IterationStats(mm_cache_stats=MultiModalCacheStats(queries=2, hits=2)))
    logger.record(None, IterationStats())  # no cache
    m = exposed(logger)
    assert m["vllm:mm_cache_queries_total"][label] == 5
    assert m["vllm:mm_cache_hits_total"][label] == 3
