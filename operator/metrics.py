"""The operator's own Prometheus metrics."""

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


def serve_metrics(port: int, address: str) -> None:
    start_http_server(port, addr=address)
