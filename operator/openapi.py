"""Small builders for structural OpenAPI v3 schemas (the subset a CRD accepts)."""

from typing import Any

Schema = dict[str, Any]

# The Kubernetes quantity grammar (what resource.Quantity parses), as the API server's own types use.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# DNS-1123 subdomain, for names of Secrets, claims and classes.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def obj(
    properties: dict[str, Schema],
    *,
    required: list[str] | None = None,
    rules: list[Schema] | None = None,
    description: str | None = None,
) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if description:
        schema["description"] = description
    if required:
        schema["required"] = required
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def string(description: str | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "string"}
    if description:
        schema["description"] = description
    schema.update(extra)
    return schema


def integer(description: str | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "integer"}
    if description:
        schema["description"] = description
    schema.update(extra)
    return schema


def number(description: str | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "number"}
    if description:
        schema["description"] = description
    schema.update(extra)
    return schema


def boolean() -> Schema:
    return {"type": "boolean"}


def enum(values: list[str], description: str | None = None, **extra: Any) -> Schema:
    return string(description, enum=list(values), **extra)


def string_map(description: str | None = None) -> Schema:
    schema: Schema = {
        "type": "object",
        "additionalProperties": {"type": "string", "maxLength": 4096},
        "maxProperties": 64,
    }
    if description:
        schema["description"] = description
    return schema


def quantity(description: str | None = None) -> Schema:
    schema: Schema = {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "maxLength": 64,
        "x-kubernetes-int-or-string": True,
    }
    if description:
        schema["description"] = description
    return schema


def free_object(description: str | None = None) -> Schema:
    """An object whose inside is Kubernetes' own type (affinity, valueFrom), kept as given."""
    schema: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if description:
        schema["description"] = description
    return schema


def array(
    items: Schema,
    *,
    max_items: int,
    description: str | None = None,
    rules: list[Schema] | None = None,
) -> Schema:
    schema: Schema = {"type": "array", "items": items, "maxItems": max_items}
    if description:
        schema["description"] = description
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def rule(
    expression: str, message: str, field_path: str | None = None, reason: str | None = None
) -> Schema:
    validation: Schema = {"rule": expression, "message": message}
    if field_path:
        validation["fieldPath"] = field_path
    if reason:
        validation["reason"] = reason
    return validation


def undeclared_fields(value: Any, schema: Schema, path: str) -> list[tuple[str, list[str]]]:
    """(path, the declared names there) of every key of ``value`` that ``schema`` does not
    declare, as the API server's strict field validation finds them (an object with
    ``properties`` declares exactly those; a map's ``additionalProperties`` and
    ``x-kubernetes-preserve-unknown-fields`` take any key)."""
    found: list[tuple[str, list[str]]] = []
    if isinstance(value, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return found
        properties = schema.get("properties")
        entries = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                found += undeclared_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(entries, dict):
                found += undeclared_fields(item, entries, f"{path}.{key}")
            elif properties is not None and not entries:
                found.append((f"{path}.{key}", sorted(properties)))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += undeclared_fields(item, schema["items"], f"{path}[{index}]")
    return found
