"""Regex shorthand classes read as ASCII, as vLLM's default structured-output backend (xgrammar)
reads them: ``\\d`` is ``[0-9]``, ``\\w`` ``[0-9A-Za-z_]``, ``\\s`` ``[ \\t\\n\\r\\f\\v]``, and their
capitals the complements. llguidance follows Rust's regex crate, where they are Unicode classes:
``\\d{3}-\\d{4}`` then admits ``'۸40-᱙߃98'``, which no user of the pattern means.

The rewrite is lexical: escapes (``\\\\d`` stays a backslash and a d) and character classes
(``[\\d.]`` becomes ``[0-9.]``) are followed; inside a class a negated shorthand (``[\\D]``)
cannot be spelt as a range, so it is kept (and stays Unicode)."""

from __future__ import annotations

from typing import Any

_RANGES = {"d": "0-9", "w": "0-9A-Za-z_", "s": " \\t\\n\\r\\f\\v"}


def ascii_classes(pattern: str) -> str:
    """``pattern`` with ``\\d``, ``\\w``, ``\\s`` (and ``\\D``, ``\\W``, ``\\S`` outside brackets)
    spelt as ASCII classes."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            ranges = _RANGES.get(escaped.lower())
            if ranges is None or (in_class and escaped.isupper()):
                out.append(pattern[i : i + 2])
            elif in_class:
                out.append(ranges)
            else:
                out.append(f"[{'^' if escaped.isupper() else ''}{ranges}]")
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            # a ']' right after '[' or '[^' is a literal member, not the end
            for lead in ("^", "]"):
                if pattern.startswith(lead, i + 1):
                    out.append(lead)
                    i += 1
        elif char == "]" and in_class:
            in_class = False
            out.append(char)
        else:
            out.append(char)
        i += 1
    return "".join(out)


def ascii_schema_patterns(schema: Any) -> Any:
    """A JSON schema with every string ``pattern`` (and ``patternProperties`` key) rewritten by
    ``ascii_classes``."""
    if isinstance(schema, list):
        return [ascii_schema_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rewritten: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            rewritten[key] = ascii_classes(value)
        elif key == "patternProperties" and isinstance(value, dict):
            rewritten[key] = {ascii_classes(k): ascii_schema_patterns(v) for k, v in value.items()}
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            # names of properties, not schema keywords: a property may be called "pattern"
            rewritten[key] = {k: ascii_schema_patterns(v) for k, v in value.items()}
        else:
            rewritten[key] = ascii_schema_patterns(value)
    return rewritten
