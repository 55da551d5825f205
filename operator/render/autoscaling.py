"""spec.autoscaling -> the autoscaler of the InferenceService's scale subresource.

Both autoscalers target the InferenceService itself (apiVersion/kind/name; the CRD's scale
subresource maps to spec.replicas and reads the pods by status.selector), so the replica count
they choose flows through the same render as any other: no second writer of the Deployment.

- KEDA's ScaledObject API served and `keda` set: a ScaledObject with one Prometheus trigger per
  target. The queue target is per replica (KEDA's default AverageValue: the summed queue over
  the replica count); the KV-cache target compares the replicas' average (metricType Value).
  minReplicas 0 scales to zero. Back up from zero needs demand that something records while no
  engine runs: with spec.routing, the endpoint picker counts every request the Gateway sends it
  (render.picker_metrics), and a third trigger, on that count, activates the service (its value
  is 0 or 1 as an `AverageValue` metric with threshold 1: it asks for one replica while requests
  come, never more, so the HPA's max over triggers leaves scaling above one to the others).
  Without a scraped picker nothing does, and the condition says so.
- Otherwise: an autoscaling/v2 HorizontalPodAutoscaler with `Pods` metrics read through the
  custom-metrics API, named as prometheus-adapter exposes vLLM's (the colon becomes `_`). An HPA
  cannot scale to zero, so minReplicas 0 without KEDA renders nothing and says why.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import KEDA_GV, ClusterFacts
from infernetes.operator.spec_schema import (
    DEFAULT_SCALE_DOWN_SECONDS,
    LATENCY_DEFAULT_PERCENTILE,
    LATENCY_DEFAULT_WINDOW_SECONDS,
)
from infernetes.operator.status import Verdict

QUEUE_METRIC = "vllm:num_requests_waiting"
KV_METRIC = "vllm:kv_cache_usage_perc"
TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"
# spec.autoscaling.latency's fields, the histogram each reads and the trigger's name.
LATENCY_TARGETS = (
    ("ttftSeconds", TTFT_METRIC, "time-to-first-token"),
    ("interTokenSeconds", ITL_METRIC, "inter-token-latency"),
)
# KEDA copies a ScaledObject's labels onto the HPA it creates; ours would make that HPA look like
# one of the operator's children (the watch selects them by label), so it is told to leave them.
KEDA_EXCLUDED_LABELS = "scaledobject.keda.sh/hpa-excluded-labels"


NO_ACTIVATION = "NothingActivatesFromZero"
NOTHING_WAKES = (
    "but nothing brings it back from zero: with no replica no engine reports "
    f"{QUEUE_METRIC}. Set spec.routing (its endpoint picker counts the requests that arrive "
    "while there is no replica) with spec.monitoring.mode other than none, or minReplicas 1; "
    "until then only raising spec.replicas (kubectl scale infsvc) ends a stay at zero"
)


@dataclass
class Autoscaler:
    manifests: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None  # None: spec.autoscaling is not set


def custom_metric_name(metric: str) -> str:
    """The name prometheus-adapter gives a Prometheus series in the custom-metrics API."""
    return metric.replace(":", "_")


def _labels(*, model_name: str, namespace: str) -> str:
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    return f'namespace="{quoted(namespace)}",model_name="{quoted(model_name)}"'


def promql(metric: str, aggregation: str, *, model_name: str, namespace: str) -> str:
    return f"{aggregation}({metric}{{{_labels(model_name=model_name, namespace=namespace)}}})"


def _percentile(latency: Mapping[str, Any]) -> int:
    return latency.get("percentile", LATENCY_DEFAULT_PERCENTILE)


def _window(latency: Mapping[str, Any]) -> int:
    return latency.get("windowSeconds", LATENCY_DEFAULT_WINDOW_SECONDS)


def latency_promql(
    metric: str, latency: Mapping[str, Any], *, model_name: str, namespace: str
) -> str:
    """The percentile of a latency histogram over every replica and the window. 0 while no
    request was timed in the window: histogram_quantile gives NaN then, which `>= 0` drops."""
    labels = _labels(model_name=model_name, namespace=namespace)
    rate = f"rate({metric}_bucket{{{labels}}}[{_window(latency)}s])"
    quantile = f"histogram_quantile({_percentile(latency) / 100}, sum by (le) ({rate}))"
    return f"({quantile} >= 0) or vector(0)"


def latency_metric_name(metric: str, latency: Mapping[str, Any]) -> str:
    """The external metric an HPA reads for a latency target (the adapter rule that serves it
    fixes the percentile and the window, so both are in the name)."""
    return f"{custom_metric_name(metric)}_p{_percentile(latency)}_{_window(latency)}s"


def seconds_quantity(seconds: float) -> str:
    """Seconds as a Kubernetes quantity (0.5 -> 500m, 0.0001 -> 100u)."""
    for suffix, scale in (("", 1), ("m", 10**3), ("u", 10**6)):
        scaled = round(seconds * scale, 6)
        if scaled == int(scaled):
            return f"{int(scaled)}{suffix}"
    return f"{round(seconds * 10**9)}n"


def _latency_targets(autoscaling: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """(metric, trigger name, target seconds) of each latency target set."""
    latency = autoscaling.get("latency") or {}
    return [
        (metric, trigger, latency[field])
        for field, metric, trigger in LATENCY_TARGETS
        if field in latency
    ]


def _scale_target(name: str) -> dict[str, str]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": name}


def _behavior(autoscaling: Mapping[str, Any]) -> dict[str, Any]:
    up = autoscaling.get("scaleUpStabilizationSeconds", 0)
    down = autoscaling.get("scaleDownStabilizationSeconds", DEFAULT_SCALE_DOWN_SECONDS)
    return {
        "scaleUp": {"stabilizationWindowSeconds": up},
        "scaleDown": {"stabilizationWindowSeconds": down},
    }


def _targets(autoscaling: Mapping[str, Any]) -> str:
    parts = []
    if "targetQueuedRequests" in autoscaling:
        parts.append(f"{QUEUE_METRIC} {autoscaling['targetQueuedRequests']} per replica")
    if "targetKVCacheUsagePercent" in autoscaling:
        parts.append(f"{KV_METRIC} {autoscaling['targetKVCacheUsagePercent']}%")
    for metric, _, seconds in _latency_targets(autoscaling):
        latency = autoscaling["latency"]
        parts.append(f"{metric} p{_percentile(latency)} over {_window(latency)}s {seconds}s")
    return " and ".join(parts)


def demand_trigger(server: str, demand: str) -> dict[str, Any]:
    return {
        "type": "prometheus",
        "name": "gateway-requests",
        # desired = ceil(value / threshold): 1 while requests come, 0 without; a `Value` metric
        # would ask for the current count and pin the replicas while any request arrives
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": server,
            "query": demand,
            "threshold": "1",
            "activationThreshold": "0",
        },
    }


def scaled_object(
    autoscaling: Mapping[str, Any],
    *,
    name: str,
    namespace: str,
    model_name: str,
    demand: str | None = None,
) -> dict[str, Any]:
    keda = autoscaling["keda"]
    server = keda["prometheusServerAddress"]
    minimum = autoscaling.get("minReplicas", 1)
    triggers = []
    if "targetQueuedRequests" in autoscaling:
        metadata = {
            "serverAddress": server,
            "query": promql(QUEUE_METRIC, "sum", model_name=model_name, namespace=namespace),
            "threshold": str(autoscaling["targetQueuedRequests"]),
        }
        if minimum == 0:
            metadata["activationThreshold"] = str(keda.get("activationQueuedRequests", 0))
        triggers.append({"type": "prometheus", "name": "queued-requests", "metadata": metadata})
    if "targetKVCacheUsagePercent" in autoscaling:
        triggers.append(
            {
                "type": "prometheus",
                "name": "kv-cache-usage",
                "metricType": "Value",
                "metadata": {
                    "serverAddress": server,
                    "query": promql(KV_METRIC, "avg", model_name=model_name, namespace=namespace),
                    "threshold": str(autoscaling["targetKVCacheUsagePercent"] / 100),
                },
            }
        )
    for metric, trigger, seconds in _latency_targets(autoscaling):
        query = latency_promql(
            metric, autoscaling["latency"], model_name=model_name, namespace=namespace
        )
        triggers.append(
            {
                "type": "prometheus",
                "name": trigger,
                # desired = ceil(replicas x measured / target): more replicas as latency grows
                "metricType": "Value",
                "metadata": {"serverAddress": server, "query": query, "threshold": str(seconds)},
            }
        )
    if minimum == 0 and demand:
        triggers.append(demand_trigger(server, demand))
    spec: dict[str, Any] = {
        "scaleTargetRef": _scale_target(name),
        "minReplicaCount": minimum,
        "maxReplicaCount": autoscaling["maxReplicas"],
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(autoscaling)}},
        "triggers": triggers,
    }
    if minimum == 0:
        # How long the triggers stay inactive before the last replica goes.
        spec["cooldownPeriod"] = autoscaling.get(
            "scaleDownStabilizationSeconds", DEFAULT_SCALE_DOWN_SECONDS
        )
    labels = names.common_labels(name)
    return {
        "apiVersion": KEDA_GV,
        "kind": "ScaledObject",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {KEDA_EXCLUDED_LABELS: ",".join(labels)},
        },
        "spec": spec,
    }


def horizontal_pod_autoscaler(
    autoscaling: Mapping[str, Any], *, name: str, namespace: str, model_name: str
) -> dict[str, Any]:
    metrics = []
    if "targetQueuedRequests" in autoscaling:
        metrics.append((QUEUE_METRIC, str(autoscaling["targetQueuedRequests"])))
    if "targetKVCacheUsagePercent" in autoscaling:
        # A fraction in 0..1 as a quantity: 80 % is 800m.
        metrics.append((KV_METRIC, f"{autoscaling['targetKVCacheUsagePercent'] * 10}m"))
    pod_metrics = [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": custom_metric_name(metric)},
                "target": {"type": "AverageValue", "averageValue": value},
            },
        }
        for metric, value in metrics
    ]
    external_metrics = [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": latency_metric_name(metric, autoscaling["latency"]),
                    "selector": {"matchLabels": {"model_name": model_name}},
                },
                "target": {"type": "Value", "value": seconds_quantity(seconds)},
            },
        }
        for metric, _, seconds in _latency_targets(autoscaling)
    ]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace, "labels": names.common_labels(name)},
        "spec": {
            "scaleTargetRef": _scale_target(name),
            "minReplicas": autoscaling.get("minReplicas", 1),
            "maxReplicas": autoscaling["maxReplicas"],
            "metrics": pod_metrics + external_metrics,
            "behavior": _behavior(autoscaling),
        },
    }


def autoscaler(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    *,
    name: str,
    namespace: str,
    model_name: str,
    demand: str | None = None,
    at_zero: str = "",
) -> Autoscaler:
    """The autoscaler for spec.autoscaling; `demand` is the endpoint picker's request query
    (render.picker_metrics), when one is rendered and scraped, and `at_zero` what the picker
    does with the requests that arrive meanwhile."""
    autoscaling = spec.get("autoscaling")
    if not autoscaling:
        return Autoscaler()
    minimum, maximum = autoscaling.get("minReplicas", 1), autoscaling["maxReplicas"]
    keda_served = facts.serves(KEDA_GV, "ScaledObject")
    if keda_served and autoscaling.get("keda"):
        server = autoscaling["keda"]["prometheusServerAddress"]
        scaled = scaled_object(
            autoscaling, name=name, namespace=namespace, model_name=model_name, demand=demand
        )
        scales = (
            f"KEDA scales {minimum} to {maximum} replicas on {_targets(autoscaling)} "
            f"(Prometheus at {server})"
        )
        if minimum > 0:
            return Autoscaler([scaled], ("True", "ScaledObject", scales))
        if demand is None:
            return Autoscaler([scaled], ("False", NO_ACTIVATION, f"{scales}, {NOTHING_WAKES}"))
        return Autoscaler(
            [scaled],
            (
                "True",
                "ScaledObject",
                f"{scales}; from zero when the endpoint picker sees requests (its "
                "inference_objective_request_total and _error_total counters, and the "
                f"requests its flow control holds); meanwhile {at_zero}",
            ),
        )
    if minimum == 0:
        return Autoscaler(
            [],
            (
                "False",
                "ScaleToZeroNeedsKEDA",
                f"autoscaling.minReplicas is 0 but the cluster does not serve {KEDA_GV} "
                "ScaledObject, and a HorizontalPodAutoscaler cannot scale to zero: no autoscaler "
                "was created; install KEDA or set minReplicas to 1 or more",
            ),
        )
    metric_names = ", ".join(
        custom_metric_name(metric)
        for key, metric in (
            ("targetQueuedRequests", QUEUE_METRIC),
            ("targetKVCacheUsagePercent", KV_METRIC),
        )
        if key in autoscaling
    )
    latency_names = ", ".join(
        latency_metric_name(metric, autoscaling["latency"])
        for metric, _, _ in _latency_targets(autoscaling)
    )
    read = " and ".join(
        part
        for part in (
            metric_names and f"as pod metrics {metric_names} from the custom-metrics API",
            latency_names and f"as external metrics {latency_names}",
        )
        if part
    )
    return Autoscaler(
        [
            horizontal_pod_autoscaler(
                autoscaling, name=name, namespace=namespace, model_name=model_name
            )
        ],
        (
            "True",
            "HorizontalPodAutoscaler",
            f"an HPA scales {minimum} to {maximum} replicas on {_targets(autoscaling)}, read "
            f"{read}",
        ),
    )
