"""The operator's own Prometheus metrics."""

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "infernetes_operator_reconciles_total",
    "Reconciliations of InferenceServices, by result.",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "infernetes_operator_reconcile_duration_seconds",
    "Time to render and apply one InferenceService.",
)
STATUS_UPDATES = Counter(
    "infernetes_operator_status_updates_total", "Status writes derived from child objects."
)
MANAGED = Gauge(
    "infernetes_operator_inference_services", "InferenceServices the operator currently sees."
)


def serve_metrics(port: int, address: str) -> None:
    start_http_server(port, addr=address)
