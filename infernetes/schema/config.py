"""``ServeConfig``: the validated, immutable server configuration, and ``build_config`` to make one."""

from __future__ import annotations

import difflib
import json
import warnings
from collections.abc import Iterator
from typing import Any

from infernetes.schema.args import BY_DEST, CURRENT_ARGS, GROUPS, Arg
from infernetes.schema.convert import convert
from infernetes.schema.deprecations import apply_deprecations
from infernetes.schema.errors import ConfigError
from infernetes.schema.frozen import freeze, thaw

# A tool-call parser registered by --tool-parser-plugin is a valid name beyond the built-in ones.
_CHOICES_OPENED_BY = {"tool_call_parser": "tool_parser_plugin"}

__all__ = ["ConfigError", "ServeConfig", "build_config", "validate"]


class ServeConfig:
    """Every ``serve`` argument as an attribute by its dest: ``cfg.max_num_seqs``.

    Immutable: JSON objects and lists are read-only (they compare equal to plain dicts and lists);
    ``replace`` makes changed copies. Create one with ``build_config`` or ``parse_serve_args``.
    """

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any], *, _validated: bool = False) -> None:
        if not _validated:
            raise TypeError("use build_config(...) or parse_serve_args(...) to make a ServeConfig")
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        if name == "_values":  # not set yet (e.g. mid-unpickling): never recurse
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"ServeConfig has no argument {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ServeConfig is immutable; use cfg.replace(...)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServeConfig) and self._values == other._values

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True, default=str))

    def __repr__(self) -> str:
        changed = ", ".join(f"{k}={v!r}" for k, v in self.non_defaults().items())
        return f"ServeConfig({changed})"

    def __reduce__(self) -> tuple:
        return (_restore, (self.to_dict(),))

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def to_dict(self) -> dict[str, Any]:
        """All values by dest, as plain JSON-shaped data."""
        return {dest: thaw(value) for dest, value in self._values.items()}

    def grouped(self) -> dict[str, dict[str, Any]]:
        """``{group: {dest: value}}`` in the schema's group order."""
        out: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        for arg in CURRENT_ARGS:
            out[arg.group][arg.dest] = thaw(self._values[arg.dest])
        return {group: values for group, values in out.items() if values}

    def non_defaults(self) -> dict[str, Any]:
        """The values that differ from the schema defaults, as plain data."""
        return {
            arg.dest: thaw(self._values[arg.dest])
            for arg in CURRENT_ARGS
            if self._values[arg.dest] != freeze(arg.default)
        }

    def replace(self, **changes: Any) -> ServeConfig:
        """A new validated config with some values changed."""
        return build_config(**{**self.non_defaults(), **changes})


def _restore(values: dict[str, Any]) -> ServeConfig:
    return ServeConfig({k: freeze(v) for k, v in values.items()}, _validated=True)


def build_config(model: str | None = None, **overrides: Any) -> ServeConfig:
    """The keyword form of the command line: ``build_config("org/model", max_num_seqs=8)``.

    Values may be typed (``8``) or strings as on the command line (``"8"``, ``"1k"``). Deprecated
    arguments are accepted with a ``FutureWarning`` and moved onto their replacements. Raises
    ``ConfigError`` naming the argument and what it allows.
    """
    if model is not None:
        overrides["model"] = model
    given, notices = apply_deprecations(_known(overrides))
    for notice in notices:
        warnings.warn(notice, FutureWarning, stacklevel=2)
    return validate(given)


def validate(given: dict[str, Any]) -> ServeConfig:
    """Fills defaults, converts and checks each value, then the rules across arguments."""
    from infernetes.schema.rules import check_rules

    values: dict[str, Any] = {}
    for arg in CURRENT_ARGS:
        if arg.dest in given:
            values[arg.dest] = convert(arg, given[arg.dest], _open_choices(arg, given))
        else:
            values[arg.dest] = arg.default
    check_rules(values)
    return ServeConfig({k: freeze(v) for k, v in values.items()}, _validated=True)


def _known(overrides: dict[str, Any]) -> dict[str, Any]:
    for dest in overrides:
        if dest not in BY_DEST:
            close = difflib.get_close_matches(dest, list(BY_DEST), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown argument {dest!r}{hint}", dest)
    return overrides


def _open_choices(arg: Arg, given: dict[str, Any]) -> bool:
    opener = _CHOICES_OPENED_BY.get(arg.dest)
    return bool(opener and given.get(opener))
