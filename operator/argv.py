"""spec.engine -> `infernetes serve` argv, and spec.engineEnv -> container env.

The exact inverse of the schema's parser: parsing the rendered argv gives back the spec's values
(tests check parse(render(spec)) == spec through infernetes.schema).
"""

import functools
from collections.abc import Mapping
from typing import Any

from infernetes.operator.engine_schema import camel, engine_args, engine_env_vars

from infernetes.schema.args import ARGS
from infernetes.schema.declare import Arg
from infernetes.schema.env import ENV_VARS
from infernetes.schema.render import render_arg


class EngineSpecError(ValueError):
    """A spec.engine / spec.engineEnv field the schema does not know (the CRD would prune it)."""


@functools.cache
def engine_fields() -> dict[str, Arg]:
    """spec.engine's fields (camelCase) and their arguments, in the schema's table order."""
    return {camel(arg.dest): arg for arg in engine_args(ARGS)}


def engine_argv(engine: Mapping[str, Any]) -> list[str]:
    """Flags for every field set in spec.engine, in the schema's table order."""
    by_field = engine_fields()
    unknown = sorted(set(engine) - set(by_field))
    if unknown:
        raise EngineSpecError(f"spec.engine: unknown field(s) {', '.join(unknown)}")
    argv: list[str] = []
    for field, arg in by_field.items():
        value = engine.get(field)
        if value is None or (arg.is_list and not value):
            continue
        argv.extend(render_arg(arg, value))
    return argv


def env_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def engine_env(engine_env_spec: Mapping[str, Any]) -> list[dict[str, str]]:
    """Container env entries for spec.engineEnv, in the schema's table order."""
    known = [var.name for var in engine_env_vars(ENV_VARS)]
    unknown = sorted(set(engine_env_spec) - set(known))
    if unknown:
        raise EngineSpecError(
            f"spec.engineEnv: unknown or operator-owned variable(s) {', '.join(unknown)}"
        )
    return [
        {"name": name, "value": env_value(engine_env_spec[name])}
        for name in known
        if engine_env_spec.get(name) is not None
    ]
