"""The operator's own Prometheus metrics."""

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "infernetes_operator_reconciles_total",
    "Reconciliations of InferenceServices, by result.",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "infernetes_operator_reconcile_duration_seconds",
    "Time of one reconcile pass (render, apply what differs, status).",
)
STATUS_UPDATES = Counter("infernetes_operator_status_updates_total", "Status writes.")
API_WRITES = Counter(
    "infernetes_operator_api_writes_total",
    "Writes to the API server, by kind (InferenceService for its status) and verb.",
    ["kind", "verb"],
)
MANAGED = Gauge(
    "infernetes_operator_inference_services", "InferenceServices the operator currently sees."
)

CONDITION = Gauge(
    "infernetes_operator_inference_service_condition",
    "1 for each condition of each InferenceService's status, labelled by its status.",
    # Not `namespace`: Prometheus would rename it, the target's own namespace label wins.
    ["inference_service_namespace", "inference_service", "condition", "status"],
)


class ConditionSeries:
    """The CONDITION series of each InferenceService: those of the status last written, and
    none once the service is gone (a stale series would keep counting a deleted service)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.exported: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def set(self, key: tuple[str, str], conditions: Iterable[Mapping[str, Any]] | None) -> None:
        now = {(c["type"], c["status"]) for c in conditions or ()}
        for kind, status in self.exported.get(key, set()) - now:
            self.gauge.remove(*key, kind, status)
        for kind, status in now:
            self.gauge.labels(*key, kind, status).set(1)
        self.exported[key] = now

    def forget(self, key: tuple[str, str]) -> None:
        self.set(key, ())
        self.exported.pop(key, None)


# One for the process, as the gauge is: what it exported is what it must remove.
CONDITIONS = ConditionSeries(CONDITION)


def serve_metrics(port: int, address: str) -> None:
    start_http_server(port, addr=address)
