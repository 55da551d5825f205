"""What admission refuses because the runtime would: the support table
(`infernetes.schema.support`) narrowed onto the fields of spec.engine and spec.engineEnv, and
onto the keys of its JSON-valued fields (``KEY_SUPPORT``: spec.engine.structuredOutputsConfig's
backend, speculativeConfig's method, kvTransferConfig's kv_connector).

A refused setting may keep only its default; a partly supported one only its supported values.
Each becomes a `Refusal` (the field, what is allowed, why), which the CRD renders as a CEL rule
(the API server names the field and the reason at `kubectl apply`) and the chart's
values.schema.json as an enum (so `helm lint` refuses the same values).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infernetes.operator.engine_schema import camel, engine_args, engine_env_vars
from infernetes.operator.openapi import Schema, rule

from infernetes.schema.declare import Arg
from infernetes.schema.env import EnvVar
from infernetes.schema.rules import STRUCTURED_OUTPUTS_KEYS
from infernetes.schema.support import ARG_SUPPORT, ENV_SUPPORT, KEY_SUPPORT, Support


@dataclass(frozen=True)
class Refusal:
    field: str  # the camelCase engine field, or the variable's name under engineEnv
    allowed: tuple[Any, ...]  # empty: the field must be left unset
    message: str


def _same_as_default(kind: str, default: Any) -> tuple[Any, ...]:
    """The values a field may hold and still mean the default (an unset field always does)."""
    if default is None:
        return (False,) if kind == "bool" else ()
    if default in ({}, []):
        return ()
    return (float(default),) if kind == "float" else (default,)


def _shown(values: Iterable[Any]) -> str:
    """Values as a YAML author writes them: true, 0, hermes."""

    def one(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)

    return ", ".join(one(value) for value in values)


def refusal(field: str, name: str, kind: str, default: Any, support: Support) -> Refusal | None:
    """The admission limit of one field whose runtime spelling is ``name`` (flag or variable)."""
    defaults = _same_as_default(kind, default)
    if support.kind == "refused":
        if not defaults:
            return Refusal(field, (), f"{name} is not supported: {support.reason}; leave it unset")
        return Refusal(
            field,
            defaults,
            f"{name} is not supported: {support.reason}; only {_shown(defaults)} is accepted",
        )
    if support.kind == "partial" and support.others == "refused":
        allowed = tuple(dict.fromkeys((*support.values, *defaults)))
        return Refusal(
            field,
            allowed,
            f"{name} is not supported with this value: {support.reason}; supported: {_shown(allowed)}",
        )
    return None


def engine_refusals(args: Iterable[Arg]) -> list[Refusal]:
    found = (
        refusal(camel(arg.dest), arg.flag, arg.kind, arg.default, ARG_SUPPORT[arg.dest])
        for arg in engine_args(args)
    )
    return [item for item in found if item is not None]


def env_refusals(env_vars: Iterable[EnvVar]) -> list[Refusal]:
    found = (
        refusal(var.name, var.name, var.kind, var.default, ENV_SUPPORT[var.name])
        for var in engine_env_vars(env_vars)
    )
    return [item for item in found if item is not None]


# The types of JSON keys whose refusal admission can only state with a type (a key the CRD
# declares with none cannot be named in a rule).
_KEY_KINDS = {
    f"structured_outputs_config.{key}": {bool: "bool", str: "str"}.get(kind, "json")
    for key, (kind, _) in STRUCTURED_OUTPUTS_KEYS.items()
}
_OPENAPI_TYPES = {bool: "boolean", str: "string"}


def key_refusals() -> dict[str, list[Refusal]]:
    """The refused values of JSON-valued engine fields' keys, by the field's camelCase name;
    each `Refusal.field` is the key as the JSON spells it. Only keys whose allowed values say
    their type (a key refused outright whose type is unknown is left to the runtime)."""
    found: dict[str, list[Refusal]] = {}
    for path, support in KEY_SUPPORT.items():
        dest, key = path.split(".", 1)
        name = f"--{dest.replace('_', '-')}.{key}"
        item = refusal(key, name, _KEY_KINDS.get(path, "json"), None, support)
        if item is not None and item.allowed:
            found.setdefault(camel(dest), []).append(item)
    return found


def declare_keys(schema: Schema, refusals: list[Refusal]) -> None:
    """Declares the refused keys of a free-form object with their type (its other keys stay
    free), so rules can name them."""
    properties = schema.setdefault("properties", {})
    for item in refusals:
        kinds = {_OPENAPI_TYPES[type(value)] for value in item.allowed}
        if len(kinds) != 1:
            raise ValueError(f"{item.field}: allowed values of mixed types {item.allowed}")
        properties[item.field] = {"type": kinds.pop()}


def _cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise TypeError(f"no CEL literal for {value!r}")


def narrow_with_cel(schema: Schema, refusals: list[Refusal]) -> None:
    """Adds each refusal to an object schema (spec.engine or spec.engineEnv) as a CEL rule: on
    the field itself when it has allowed values, else on the object (an unset field has no rule
    of its own to run). The message leads the field's description too (`kubectl explain`)."""
    object_rules = schema.setdefault("x-kubernetes-validations", [])
    for item in refusals:
        if not item.allowed:
            object_rules.append(
                rule(
                    f"!has(self.{item.field})",
                    item.message,
                    field_path=f".{item.field}",
                    reason="FieldValueForbidden",
                )
            )
            continue
        literals = [_cel_literal(value) for value in item.allowed]
        check = (
            f"self == {literals[0]}" if len(literals) == 1 else f"self in [{', '.join(literals)}]"
        )
        field_rules = schema["properties"][item.field].setdefault("x-kubernetes-validations", [])
        field_rules.append(rule(check, item.message))
    for item in refusals:
        field = schema["properties"][item.field]
        field["description"] = f"{item.message}. {field.get('description', '')}".strip()
    if not object_rules:
        del schema["x-kubernetes-validations"]


def narrow_with_enums(schema: Schema, refusals: Iterable[Refusal]) -> None:
    """The same limits in plain JSON Schema (for Helm): an enum of the allowed values, or no value
    at all."""
    for item in refusals:
        field = schema["properties"][item.field]
        if item.allowed:
            field["enum"] = list(item.allowed)
        else:
            field["not"] = {}
