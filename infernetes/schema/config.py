"""``ServeConfig``: the validated, immutable server configuration, and ``build_config`` to make one."""

from __future__ import annotations

import difflib
import json
import warnings
from collections.abc import Iterator
from typing import Any

from infernetes.schema.args import BY_DEST, CURRENT_ARGS, GROUPS, Arg
from infernetes.schema.deprecations import apply_deprecations
from infernetes.schema.frozen import freeze, thaw
from infernetes.schema.values import CONVERTERS

# A tool-call parser registered by --tool-parser-plugin is a valid name beyond the built-in ones.
_CHOICES_OPENED_BY = {"tool_call_parser": "tool_parser_plugin"}


class ConfigError(ValueError):
    """A bad argument value; ``dest`` names the argument (None for rules across several)."""

    def __init__(self, message: str, dest: str | None = None) -> None:
        super().__init__(message)
        self.dest = dest

    @property
    def flag(self) -> str | None:
        return f"--{self.dest.replace('_', '-')}" if self.dest else None


class ServeConfig:
    """Every ``serve`` argument as an attribute by its dest: ``cfg.max_num_seqs``.

    Immutable: JSON objects are read-only dicts and lists are tuples. Make changed copies with
    ``replace``. Create one with ``build_config`` or ``parse_serve_args``.
    """

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any], *, _validated: bool = False) -> None:
        if not _validated:
            raise TypeError("use build_config(...) or parse_serve_args(...) to make a ServeConfig")
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
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


def convert(arg: Arg, value: Any, open_choices: bool = False) -> Any:
    """The typed, checked value of one argument (lists for list arguments)."""
    if value is None or value == "None":
        if arg.default is None or arg.kind == "json":
            return None
        raise ConfigError(f"argument {arg.flag}: a value is required (default {arg.default!r})", arg.dest)
    if arg.kind == "size" and isinstance(value, str) and value.strip().lower() == "auto":
        if arg.default is None:
            return None
        raise ConfigError(f"argument {arg.flag}: 'auto' is not allowed here", arg.dest)
    if arg.is_list:
        items = list(value) if isinstance(value, list | tuple) else [value]
        return [_convert_one(arg, item, open_choices) for item in items]
    return _convert_one(arg, value, open_choices)


def _compilation_level(value: Any) -> Any:
    """``-O3`` / ``--compilation-config 3``: a bare number is the optimization level."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"level": value}
    if isinstance(value, str) and value.strip().isdigit():
        return {"level": int(value)}
    return value


_SHORTHANDS = {"compilation_config": _compilation_level}


def _convert_one(arg: Arg, value: Any, open_choices: bool) -> Any:
    shorthand = _SHORTHANDS.get(arg.dest)
    if shorthand is not None:
        value = shorthand(value)
    try:
        converted = CONVERTERS[arg.kind](value)
    except ValueError as exc:
        raise ConfigError(f"argument {arg.flag}: {exc}", arg.dest) from None
    if arg.choices is not None and not open_choices:
        converted = _in_choices(arg, converted)
    _in_range(arg, converted)
    return converted


def _in_choices(arg: Arg, value: Any) -> Any:
    if value in arg.choices:
        return value
    if isinstance(value, str):
        for choice in arg.choices:
            if isinstance(choice, str) and choice.lower() == value.lower():
                return choice
    allowed = ", ".join(str(c) for c in arg.choices)
    raise ConfigError(f"argument {arg.flag}: invalid choice {value!r} (choose from {allowed})", arg.dest)


def _in_range(arg: Arg, value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    low, high = arg.minimum, arg.maximum
    too_low = low is not None and (value <= low if arg.exclusive_minimum else value < low)
    too_high = high is not None and value > high
    if too_low or too_high:
        left = "(" if arg.exclusive_minimum else "["
        bounds = f"{left}{_num(low) if low is not None else '-inf'}, {_num(high) if high is not None else 'inf'}]"
        raise ConfigError(f"argument {arg.flag}: {value} is out of range {bounds}", arg.dest)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
