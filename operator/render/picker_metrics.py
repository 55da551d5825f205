"""The endpoint picker's own metrics: how Prometheus scrapes them, and the demand they show.

Every request a Gateway sends through an InferencePool passes the pool's endpoint picker, which
counts it (Gateway API Inference Extension v1.5.0, pkg/epp/metrics): a request it routed in
`inference_objective_request_total`, one it could not in `inference_objective_request_error_total`
(at zero replicas without flow control: error_code "ServiceUnavailable"); with flow control, a
request it holds while no pod can take it in `inference_extension_flow_control_queue_size`. The
picker keeps running while the InferenceService has no replica, so these are the one record of
demand for a service at zero: KEDA's activation trigger reads them (render.autoscaling).

The picker is scraped the way the engine is (monitoring.py's mode): a ServiceMonitor or PodMonitor
`<name>-epp`, else prometheus.io annotations on its pods. The monitors copy the pod label
`infernetes.io/endpoint-picker-for` onto the series (podTargetLabels; the Prometheus operator
writes it as `infernetes_io_endpoint_picker_for`), so a query names one service's picker whatever
the Prometheus job is called.
"""

import re
from collections.abc import Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import MONITORING_GV
from infernetes.operator.render.monitoring import METRICS_PATH

PICKER_LABEL = f"{names.GROUP}/endpoint-picker-for"
# The pod label as a Prometheus label (the Prometheus operator's sanitizeLabelName).
PICKER_SERIES_LABEL = re.sub(r"[^a-zA-Z0-9_]", "_", PICKER_LABEL)
METRICS_PORT, METRICS_PORT_NAME, METRICS_SERVICE_PORT_NAME = 9090, "metrics", "http-metrics"
REQUEST_COUNTERS = ("inference_objective_request_total", "inference_objective_request_error_total")
# The requests its flow control holds now (none are counted above until they leave the queue).
HELD_GAUGE = "inference_extension_flow_control_queue_size"
# rate() needs two samples in its window: at least this long, and four scrape intervals.
MIN_RATE_WINDOW_SECONDS = 120
UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def picker_scrape(
    mode: str, monitoring: Mapping[str, Any], *, name: str, namespace: str, picker: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The picker's monitor (ServiceMonitor/PodMonitor) and pod annotations for `mode`."""
    if mode == "none":
        return [], {}
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": METRICS_PATH,
    }
    if mode not in ("serviceMonitor", "podMonitor"):
        return [], annotations
    labels = {**(monitoring.get("labels") or {}), **names.common_labels(name)}
    interval = monitoring.get("interval", "30s")
    if mode == "serviceMonitor":
        endpoints_key, port = "endpoints", METRICS_SERVICE_PORT_NAME
        kind, selector = "ServiceMonitor", {**names.common_labels(name), PICKER_LABEL: name}
    else:
        endpoints_key, port = "podMetricsEndpoints", METRICS_PORT_NAME
        kind, selector = "PodMonitor", picker_pod_labels(name)
    monitor = {
        "apiVersion": MONITORING_GV,
        "kind": kind,
        "metadata": {"name": picker, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector},
            endpoints_key: [{"port": port, "path": METRICS_PATH, "interval": interval}],
            "podTargetLabels": [PICKER_LABEL],
        },
    }
    return [monitor], annotations


def picker_pod_labels(name: str) -> dict[str, str]:
    return {names.LABEL_NAME: "infernetes-endpoint-picker", PICKER_LABEL: name}


def interval_seconds(interval: str) -> float:
    """A scrape interval as the CRD admits it (`^[0-9]+(ms|s|m|h)$`), in seconds."""
    found = re.fullmatch(r"([0-9]+)(ms|s|m|h)", interval)
    if found is None:
        raise ValueError(f"monitoring.interval: expected a number and ms, s, m or h: {interval!r}")
    return int(found[1]) * UNIT_SECONDS[found[2]]


def demand_query(*, name: str, namespace: str, interval: str) -> str:
    """1 while the picker of `name` has seen requests within the window (routed or refused) or
    holds some now, else 0; a part with no series (never scraped yet, or no flow control) reads
    as 0."""
    window = max(MIN_RATE_WINDOW_SECONDS, int(4 * interval_seconds(interval)))
    counters = "|".join(REQUEST_COUNTERS)
    picker = f'namespace="{namespace}",{PICKER_SERIES_LABEL}="{name}"'
    seen = f'sum(rate({{__name__=~"{counters}",{picker}}}[{window}s]))'
    held = f"sum({HELD_GAUGE}{{{picker}}})"
    return f"((({seen}) or vector(0)) + (({held}) or vector(0))) > bool 0"
