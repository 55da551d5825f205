"""PromptAdapterConfig: soft-prompt adapters."""

from infernetes.schema.declare import Arg

G = "PromptAdapterConfig"

ARGS = (
    Arg("enable-prompt-adapter", "bool", None, G, "Serve prompt adapters."),
    Arg("max-prompt-adapters", "int", 1, G, "Most prompt adapters in one batch.", minimum=1),
    Arg(
        "max-prompt-adapter-token",
        "int",
        0,
        G,
        "Most virtual tokens of one prompt adapter.",
        minimum=0,
    ),
)
