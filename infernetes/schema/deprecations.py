"""Old spellings and shorthands: deprecated arguments and shorthands moved onto their
replacements, and old value forms."""

from __future__ import annotations

from typing import Any

from infernetes.schema.args import BY_DEST
from infernetes.schema.convert import convert
from infernetes.schema.errors import ConfigError

# "xgrammar:no-fallback,disable-any-whitespace": backend options that became flags of their own.
_GUIDED_OPTIONS = {
    "no-fallback": "guided_decoding_disable_fallback",
    "disable-any-whitespace": "guided_decoding_disable_any_whitespace",
    "no-additional-properties": "guided_decoding_disable_additional_properties",
}


def apply_deprecations(given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Returns the values with every deprecated dest mapped away, and one notice per old spelling.

    A value the user also gave under the new name wins over the one moved from the old name; a
    shorthand's value wins over the key it stands for (``--spec-tokens 5`` over
    ``--speculative-config '{"num_speculative_tokens": 3}'``).
    """
    result = {dest: value for dest, value in given.items() if not _is_moved(dest)}
    notices = []
    for dest, raw in given.items():
        if not _is_moved(dest):
            continue
        arg = BY_DEST[dest]
        if arg.deprecated:
            notices.append(f"{arg.flag} is deprecated: {arg.deprecated}.")
        value = convert(arg, raw)
        if arg.replaced_by is None or value is None:
            continue
        target = arg.replaced_by
        if "=" in target:
            if value is True:
                new_dest, _, new_value = target.partition("=")
                result.setdefault(new_dest, new_value)
        elif "." in target:
            new_dest, _, key = target.partition(".")
            given_there = result.get(new_dest)  # as given: a JSON string from the command line
            current = dict(convert(BY_DEST[new_dest], given_there) or {}) if given_there else {}
            if key == "model" and value == "[ngram]":  # the old way to ask for n-gram drafting
                key, value = "method", "ngram"
            if arg.deprecated:
                current.setdefault(key, value)
            else:  # a shorthand overrides its key, as in vLLM
                current[key] = value
            result[new_dest] = current
        else:
            result.setdefault(target, value)
    backend = result.get("guided_decoding_backend")
    if isinstance(backend, str) and ":" in backend:
        notices.append(_split_guided_backend(backend, result))
    return result, notices


def _split_guided_backend(value: str, result: dict[str, Any]) -> str:
    backend, _, options = value.partition(":")
    result["guided_decoding_backend"] = backend
    for option in filter(None, (o.strip() for o in options.split(","))):
        if option not in _GUIDED_OPTIONS:
            allowed = ", ".join(_GUIDED_OPTIONS)
            raise ConfigError(
                f"argument --guided-decoding-backend: unknown option {option!r} (allowed: {allowed})",
                "guided_decoding_backend",
            )
        result.setdefault(_GUIDED_OPTIONS[option], True)
    flags = " ".join(
        f"--{_GUIDED_OPTIONS[o.strip()].replace('_', '-')}" for o in options.split(",") if o.strip()
    )
    return f"--guided-decoding-backend {value} is deprecated: use --guided-decoding-backend {backend} {flags}."


def _is_moved(dest: str) -> bool:
    """A deprecated argument or a shorthand: its value goes to another argument."""
    arg = BY_DEST.get(dest)
    return arg is not None and not arg.stored
