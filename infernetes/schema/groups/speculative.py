"""SpeculativeConfig: speculative decoding (draft model, n-gram lookup, ...)."""

from infernetes.schema.declare import Arg

G = "SpeculativeConfig"

ARGS = (
    Arg(
        "speculative-config",
        "json",
        None,
        G,
        'Speculative decoding settings as JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4}.',
        aliases=("-sc",),
    ),
)
