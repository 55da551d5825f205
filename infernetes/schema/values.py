"""Converters from command-line strings to typed values, one per argument kind.

Each converter accepts either the string form (from argv, YAML or an env var) or an already typed
Python value (from ``build_config``), and raises ``ValueError`` with a short reason on bad input.
"""

from __future__ import annotations

import json
import re
from typing import Any

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*$")
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected a boolean (true/false), got {value!r}")


def parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return (
                int(value.strip(), 0)
                if value.strip()[:2].lower() in ("0x", "0o", "0b")
                else int(value)
            )
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {value!r}")


def parse_size(value: Any) -> int:
    """A count with an optional suffix: k/m/g/t are powers of 1000, K/M/G/T powers of 1024.

    Decimal suffixes take fractions (``25.6k`` = 25600); binary ones need a whole number, as a
    fraction of 1024 rarely means what the user wanted.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 2048, 1k or 1K, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"expected a size such as 2048, 1k (=1000), 1K (=1024) or 25.6k, got {value!r}"
        )
    number, suffix = match.groups()
    if not suffix:
        if "." in number:
            raise ValueError(f"expected a whole number of tokens, got {value!r}")
        return int(number)
    if suffix in _BINARY:
        if "." in number:
            raise ValueError(
                f"binary suffix {suffix} needs a whole number (use {suffix.lower()} for fractions), got {value!r}"
            )
        return int(number) * _BINARY[suffix]
    scaled = float(number) * _DECIMAL[suffix]
    if not scaled.is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(scaled)


def parse_scalar(text: str) -> Any:
    """A JSON scalar or structure when the text is valid JSON, else the text itself."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def parse_json(value: Any) -> dict | list:
    """A JSON object given whole, or ``key=value[,key=value]`` pairs (the older CLI form)."""
    if isinstance(value, dict | list):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a JSON object, got {value!r}")
    text = value.strip()
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno}): {value!r}") from None
    if "=" in text:
        pairs: dict[str, Any] = {}
        for part in text.split(","):
            key, sep, item = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"expected key=value pairs separated by commas, got {value!r}")
            pairs[key.strip()] = parse_scalar(item.strip())
        return pairs
    raise ValueError(
        f"expected a JSON object such as '{{\"key\": 1}}' or key=value pairs, got {value!r}"
    )


def parse_name_path(value: Any) -> dict:
    """An adapter given as ``name=path`` or as JSON ``{"name", "path", "base_model_name"}``."""
    if isinstance(value, dict):
        item = dict(value)
    elif isinstance(value, str) and value.strip().startswith("{"):
        try:
            item = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON ({exc.msg}): {value!r}") from None
        if not isinstance(item, dict):
            raise ValueError(f"expected a JSON object, got {value!r}")
    elif isinstance(value, str) and "=" in value:
        name, _, path = value.partition("=")
        item = {"name": name.strip(), "path": path.strip()}
    else:
        raise ValueError(f"expected name=path or a JSON object with name and path, got {value!r}")
    if not item.get("name") or not item.get("path"):
        raise ValueError(f"both a name and a path are needed, got {value!r}")
    unknown = set(item) - {"name", "path", "base_model_name"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (allowed: name, path, base_model_name)")
    return item


def parse_token(value: Any) -> str | bool:
    """``--hf-token`` alone means "use the stored login token" (True); with a value, that token."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value
    raise ValueError(f"expected a token string, got {value!r}")


def parse_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {value!r}")


CONVERTERS = {
    "str": parse_str,
    "int": parse_int,
    "float": parse_float,
    "bool": parse_bool,
    "size": parse_size,
    "json": parse_json,
    "name_path": parse_name_path,
    "token": parse_token,
}
