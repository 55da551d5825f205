"""Converting and checking one argument's value: type, choices, range."""

from __future__ import annotations

from typing import Any

from infernetes.schema.declare import Arg
from infernetes.schema.errors import ConfigError
from infernetes.schema.values import CONVERTERS


def convert(arg: Arg, value: Any, open_choices: bool = False) -> Any:
    """The typed, checked value of one argument (lists for list arguments)."""
    nullable = arg.default is None or arg.kind == "json"
    if value is None and not nullable:
        raise ConfigError(
            f"argument {arg.flag}: a value is required (default {arg.default!r})", arg.dest
        )
    if value is None or (value == "None" and nullable):  # "None" on the command line unsets
        return None
    if arg.kind == "size" and isinstance(value, str) and value.strip().lower() == "auto":
        if arg.default is None:
            return None
        raise ConfigError(f"argument {arg.flag}: 'auto' is not allowed here", arg.dest)
    if arg.is_list:
        items = list(value) if isinstance(value, list | tuple) else [value]
        if arg.choices is not None:  # older releases took one comma-separated string
            items = [
                part
                for item in items
                for part in (item.split(",") if isinstance(item, str) else [item])
            ]
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
        converted = _in_choices(arg, arg.choices, converted)
    _in_range(arg, converted)
    return converted


def _in_choices(arg: Arg, choices: tuple[Any, ...], value: Any) -> Any:
    if value in choices:
        return value
    if isinstance(value, str):
        for choice in choices:
            if isinstance(choice, str) and choice.lower() == value.lower():
                return choice
    allowed = ", ".join(str(c) for c in choices)
    raise ConfigError(
        f"argument {arg.flag}: invalid choice {value!r} (choose from {allowed})", arg.dest
    )


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
