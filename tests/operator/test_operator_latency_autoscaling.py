"""spec.autoscaling.latency: TTFT and inter-token targets at a percentile, beside the queue and
KV-cache targets."""

from typing import Any

import pytest
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import plan
from infernetes.operator.render.autoscaling import latency_promql, seconds_quantity

KEDA = ClusterFacts.from_api_versions(["keda.sh/v1alpha1"])
SERVER = "http://prometheus.monitoring.svc:9090"


def autoscaler(facts: ClusterFacts, **autoscaling: Any) -> tuple[dict, Any]:
    spec = {"model": "org/model", "servedModelName": "chat", "autoscaling": autoscaling}
    result = plan(spec, facts, name="m", namespace="ns")
    (found,) = [
        m for m in result.manifests if m["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    ]
    return found, result.autoscaling


def test_keda_gets_a_value_trigger_per_latency_target_beside_the_queue() -> None:
    scaled, verdict = autoscaler(
        KEDA,
        maxReplicas=8,
        targetQueuedRequests=4,
        latency={"ttftSeconds": 0.5, "interTokenSeconds": 0.05, "percentile": 95},
        keda={"prometheusServerAddress": SERVER},
    )
    triggers = {t["name"]: t for t in scaled["spec"]["triggers"]}
    assert set(triggers) == {"queued-requests", "time-to-first-token", "inter-token-latency"}
    ttft = triggers["time-to-first-token"]
    assert ttft["metricType"] == "Value"
    assert ttft["metadata"]["threshold"] == "0.5"
    assert ttft["metadata"]["query"] == (
        "(histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
        '{namespace="ns",model_name="chat"}[120s]))) >= 0) or vector(0)'
    )
    assert (
        "vllm:inter_token_latency_seconds_bucket"
        in triggers["inter-token-latency"]["metadata"]["query"]
    )
    assert triggers["inter-token-latency"]["metadata"]["threshold"] == "0.05"
    assert verdict[0] == "True"
    assert "vllm:time_to_first_token_seconds p95 over 120s 0.5s" in verdict[2]


def test_an_hpa_reads_latency_as_external_metrics_named_by_percentile_and_window() -> None:
    hpa, verdict = autoscaler(
        ClusterFacts(),
        maxReplicas=4,
        latency={"ttftSeconds": 2, "windowSeconds": 300},
        scaleDownStabilizationSeconds=600,
    )
    (metric,) = hpa["spec"]["metrics"]
    assert metric == {
        "type": "External",
        "external": {
            "metric": {
                "name": "vllm_time_to_first_token_seconds_p90_300s",
                "selector": {"matchLabels": {"model_name": "chat"}},
            },
            "target": {"type": "Value", "value": "2"},
        },
    }
    assert "external metrics vllm_time_to_first_token_seconds_p90_300s" in verdict[2]


@pytest.mark.parametrize(
    ("seconds", "quantity"),
    [(2, "2"), (0.5, "500m"), (0.05, "50m"), (0.0001, "100u"), (1.25, "1250m")],
)
def test_seconds_become_exact_quantities(seconds: float, quantity: str) -> None:
    assert seconds_quantity(seconds) == quantity


def test_the_query_reads_zero_when_nothing_was_timed() -> None:
    # histogram_quantile over no increase is NaN; `>= 0` drops it so `or vector(0)` answers.
    query = latency_promql(
        "vllm:time_to_first_token_seconds", {}, model_name="chat", namespace="ns"
    )
    assert query.startswith("(histogram_quantile(0.9,") and query.endswith(">= 0) or vector(0)")
