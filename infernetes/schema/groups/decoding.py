"""DecodingConfig: structured output and reasoning-content parsing."""

from infernetes.schema.choices import REASONING_PARSERS
from infernetes.schema.declare import Arg

G = "DecodingConfig"

ARGS = (
    Arg(
        "guided-decoding-backend",
        "str",
        "auto",
        G,
        "Default engine for structured output (JSON schema, regex, grammar); auto chooses per request.",
        choices=("auto", "guidance", "lm-format-enforcer", "outlines", "xgrammar"),
    ),
    Arg(
        "guided-decoding-disable-fallback",
        "bool",
        False,
        G,
        "Fail instead of falling back to another backend.",
    ),
    Arg(
        "guided-decoding-disable-any-whitespace",
        "bool",
        False,
        G,
        "Forbid free whitespace in structured output (xgrammar and guidance).",
    ),
    Arg(
        "guided-decoding-disable-additional-properties",
        "bool",
        False,
        G,
        "guidance backend: do not use additionalProperties in JSON schemas.",
    ),
    Arg(
        "structured-outputs-config",
        "json",
        {},
        G,
        "Structured output settings as JSON (vLLM's newer form of the --guided-decoding-* flags), "
        "whole or by key: backend (auto, guidance, lm-format-enforcer, outlines, xgrammar), "
        "disable_fallback, disable_any_whitespace, disable_additional_properties, "
        "reasoning_parser, enable_in_reasoning; e.g. "
        "--structured-outputs-config.disable_any_whitespace true.",
    ),
    Arg(
        "reasoning-parser",
        "str",
        None,
        G,
        "Parser that splits reasoning content from the answer; setting it turns reasoning mode on.",
        choices=REASONING_PARSERS,
    ),
    # Added in vLLM releases up to 0.33.
    Arg("reasoning-parser-plugin", "str", "", G, "Python file registering a reasoning parser."),
)
