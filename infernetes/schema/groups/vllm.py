"""VllmConfig: settings that span the whole engine (compilation, KV transfer, platform extras)."""

from infernetes.schema.declare import Arg

G = "VllmConfig"

ARGS = (
    Arg(
        "compilation-config",
        "json",
        {},
        G,
        "torch.compile settings as JSON; a bare number is the optimization level (-O3 is -O 3).",
        aliases=("-O",),
    ),
    Arg(
        "kv-transfer-config", "json", None, G, "Disaggregated-prefill KV transfer settings as JSON."
    ),
    Arg("kv-events-config", "json", None, G, "KV-cache event publishing settings as JSON."),
    Arg("additional-config", "json", {}, G, "Platform-specific extra settings as JSON."),
)
