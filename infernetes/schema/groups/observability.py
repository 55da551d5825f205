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
    # Added in vLLM releases up to 0.33.
    Arg("logging-config", "json", {}, G, "Logging settings, as JSON."),
    Arg(
        "log-level",
        "str",
        None,
        G,
        "Log level of vLLM's loggers (shortcut for --logging-config.log_level).",
        choices=("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"),
    ),
    Arg(
        "per-request-spec-decode-metrics",
        "str",
        "none",
        G,
        "Speculative decoding metrics per request: none, summary or detailed.",
        choices=("detailed", "none", "summary"),
    ),
    Arg("kv-cache-metrics", "bool", False, G, "Export KV-cache block residency metrics."),
    Arg(
        "kv-cache-metrics-sample",
        "float",
        0.01,
        G,
        "Fraction of KV-cache blocks sampled for its metrics.",
        minimum=0,
        maximum=1,
    ),
    Arg(
        "custom-histogram-buckets",
        "json",
        None,
        G,
        "Bucket boundaries of the metric histograms, as JSON.",
    ),
    Arg("cudagraph-metrics", "bool", False, G, "Export CUDA graph capture and replay metrics."),
    Arg("enable-layerwise-nvtx-tracing", "bool", False, G, "Add NVTX ranges around each layer."),
    Arg("enable-mfu-metrics", "bool", False, G, "Export model FLOPs utilization metrics."),
    Arg(
        "enable-logging-iteration-details",
        "bool",
        False,
        G,
        "Log the details of each engine iteration.",
    ),
    Arg(
        "jit-monitor-mode",
        "str",
        "warn",
        G,
        "What the JIT monitor does on a compilation while serving: warn or error.",
        choices=("error", "warn"),
    ),
    Arg("jit-monitor-verbose", "bool", False, G, "Log each JIT compilation the monitor sees."),
)
