"""Rendering a configuration back to ``serve`` argv: the inverse of ``parse_serve_args``.

``parse_serve_args(to_argv(cfg)) == cfg`` for every valid config; the operator relies on it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infernetes.schema.args import BY_DEST, CURRENT_ARGS, Arg
from infernetes.schema.config import ServeConfig
from infernetes.schema.frozen import freeze, thaw


def to_argv(config: ServeConfig | Mapping[str, Any]) -> list[str]:
    """The shortest argv that parses back to ``config``: the model first, then each non-default
    argument in schema order. A mapping is taken as ``{dest: value}`` of non-default values."""
    values = (
        config.non_defaults()
        if isinstance(config, ServeConfig)
        else {k: thaw(v) for k, v in config.items()}
    )
    unknown = sorted(set(values) - set(BY_DEST))
    if unknown:
        raise KeyError(f"unknown arguments: {', '.join(unknown)}")
    argv: list[str] = []
    if "model" in values:
        argv.append(str(values["model"]))
    for arg in CURRENT_ARGS:
        if arg.dest == "model" or arg.dest not in values:
            continue
        if freeze(values[arg.dest]) == freeze(arg.default):
            continue
        argv.extend(render_arg(arg, values[arg.dest]))
    return argv


def render_arg(arg: Arg, value: Any) -> list[str]:
    """The argv tokens that set one argument to ``value``."""
    if value is None:
        return [f"{arg.flag}=None"]
    if arg.kind == "bool":
        return [arg.flag if value else f"--no-{arg.name}"]
    if arg.kind == "token" and value is True:
        return [arg.flag]
    if arg.is_list:
        items = list(value)
        if not items:
            if arg.nargs == "*":
                return [arg.flag]
            raise ValueError(f"{arg.flag} cannot be set to an empty list on the command line")
        rendered = [_render_value(arg, item) for item in items]
        if any(item.startswith("-") for item in rendered):
            raise ValueError(
                f"{arg.flag}: list items starting with '-' cannot be given on the command line"
            )
        return [arg.flag, *rendered]
    return [f"{arg.flag}={_render_value(arg, value)}"]


def _render_value(arg: Arg, value: Any) -> str:
    if arg.kind == "json":
        return json.dumps(thaw(value), separators=(",", ":"))
    if arg.kind == "name_path":
        item = thaw(value)
        if set(item) == {"name", "path"}:
            return f"{item['name']}={item['path']}"
        return json.dumps(item, separators=(",", ":"))
    return str(value)
