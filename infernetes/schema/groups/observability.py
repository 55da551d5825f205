"""ObservabilityConfig: tracing and metrics visibility."""

from infernetes.schema.declare import Arg

G = "ObservabilityConfig"

ARGS = (
    Arg(
        "show-hidden-metrics-for-version",
        "str",
        None,
        G,
        "Bring back metrics hidden since this version (e.g. 0.7) while dashboards migrate.",
    ),
    Arg("otlp-traces-endpoint", "str", None, G, "OpenTelemetry collector URL for request traces."),
    Arg(
        "collect-detailed-traces",
        "str",
        None,
        G,
        "Modules to trace in detail (needs --otlp-traces-endpoint; costs speed).",
        choices=("all", "model", "worker"),
        nargs="+",
    ),
)
