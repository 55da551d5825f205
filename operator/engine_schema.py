"""`spec.engine` and `spec.engineEnv` of the CRD, generated from the server-argument schema.

Every `serve` argument becomes a typed camelCase field (its dest in camelCase), except the ones
the operator sets itself (`operator_owned`: host, port, model, ...), secrets (they come only from
Secret references), deprecated spellings (the CRD speaks the current names) and the served model
name (a top-level field). Defaults stay with the runtime: an unset field is an absent flag.
"""

from collections.abc import Iterable

from infernetes.operator.openapi import Schema, free_object, rule

from infernetes.schema.declare import Arg
from infernetes.schema.env import EnvVar

# Arguments that have a top-level spec field instead of an engine field.
TOP_LEVEL_ARGS = frozenset({"model", "served-model-name"})
# Not meaningful inside a pod the operator builds: a config file path replaces the typed fields,
# and a Unix socket (--uds) would hide the server from its Service and probes.
EXCLUDED_ARGS = frozenset({"config", "uds"})
# Env variables the operator sets or that only make sense outside a single-node pod.
OPERATOR_ENV = frozenset({"VLLM_PORT", "VLLM_HOST_IP", "VLLM_API_KEY"})

SIZE_PATTERN = r"^([0-9]+(\.[0-9]+)?[kmgtKMGT]?|auto)$"
STRING_MAX = 4096


def camel(dest: str) -> str:
    """max_model_len -> maxModelLen."""
    head, *rest = dest.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def engine_args(args: Iterable[Arg]) -> list[Arg]:
    """The arguments that appear as spec.engine fields, in table order."""
    return [
        arg
        for arg in args
        if not (arg.operator_owned or arg.secret or not arg.stored or arg.kind == "token")
        and arg.name not in TOP_LEVEL_ARGS
        and arg.name not in EXCLUDED_ARGS
    ]


def _value_schema(arg: Arg) -> Schema:
    """The schema of one value of the argument (lists wrap it in an array)."""
    kind = arg.kind
    schema: Schema
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "json":
        if isinstance(arg.default, list):
            return {"type": "array", "items": {"x-kubernetes-preserve-unknown-fields": True}}
        return free_object()
    if kind == "name_path":
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 256},
                "path": {"type": "string", "minLength": 1, "maxLength": STRING_MAX},
                "base_model_name": {"type": "string", "maxLength": 512},
            },
            "required": ["name", "path"],
        }
    if kind == "size":
        # An integer, or the CLI's human forms (25.6k, 1K) and auto.
        schema = {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": SIZE_PATTERN,
            "maxLength": 32,
        }
        if arg.minimum is not None:
            # minimum binds integers only; a string ("0", "0k") is held to it here.
            low = _number(arg.minimum)
            op = ">" if arg.exclusive_minimum else ">="
            schema["x-kubernetes-validations"] = [
                rule(
                    f"type(self) == int || self == 'auto' || {size_value('self')} {op} {float(low)}",
                    f"must be {'greater than' if op == '>' else 'at least'} {low}",
                )
            ]
    elif kind == "int":
        schema = {"type": "integer"}
    elif kind == "float":
        schema = {"type": "number"}
    else:
        schema = {"type": "string", "maxLength": STRING_MAX}
    if arg.choices is not None:
        schema["enum"] = list(arg.choices)
    if arg.minimum is not None:
        schema["minimum"] = _number(arg.minimum)
        if arg.exclusive_minimum:
            schema["exclusiveMinimum"] = True
    if arg.maximum is not None:
        schema["maximum"] = _number(arg.maximum)
    return schema


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def arg_schema(arg: Arg) -> Schema:
    value = _value_schema(arg)
    schema: Schema = {"type": "array", "items": value, "maxItems": 64} if arg.is_list else value
    flag = f"--{arg.name}"
    schema["description"] = f"{flag} ({arg.group}). {arg.help}".strip()
    return schema


# Multipliers of the size suffixes (infernetes.schema.values.parse_size): k/m/g/t decimal,
# K/M/G/T binary.
SIZE_SUFFIXES = {
    **{suffix: 1000.0**power for power, suffix in enumerate("kmgt", start=1)},
    **{suffix: 1024.0**power for power, suffix in enumerate("KMGT", start=1)},
}


def size_value(value: str) -> str:
    """CEL for the number a size field holds (an int, "2048", "25.6k", "1K"), as a double."""
    suffixes = ", ".join(f"'{suffix}': {scale!r}" for suffix, scale in SIZE_SUFFIXES.items())
    return (
        f"(type({value}) == int ? double({value}) : {value}.matches('^[0-9.]+$') ? double({value})"
        f" : double({value}.substring(0, {value}.size() - 1))"
        f" * {{{suffixes}}}[{value}.substring({value}.size() - 1)])"
    )


# Cross-field rules the runtime enforces too (infernetes.schema.rules), checked at admission so a
# bad resource never reaches a pod. Each names the fields it reads; a test checks they all exist.
# Size fields may hold "8k"-style strings: they are compared by value; "auto" is left to the runtime.
def _sizes(*fields: str) -> str:
    return " && ".join(
        f"has(self.{f}) && (type(self.{f}) == int || self.{f} != 'auto')" for f in fields
    )


def _size(field: str) -> str:
    return size_value(f"self.{field}")


ENGINE_RULES: list[tuple[tuple[str, ...], Schema]] = [
    (
        ("enableAutoToolChoice", "toolCallParser"),
        rule(
            "!has(self.enableAutoToolChoice) || !self.enableAutoToolChoice || has(self.toolCallParser)",
            "enableAutoToolChoice needs toolCallParser",
            field_path=".toolCallParser",
        ),
    ),
    (
        ("maxCpuLoras", "maxLoras"),
        rule(
            "!has(self.maxCpuLoras) || self.maxCpuLoras >= (has(self.maxLoras) ? self.maxLoras : 1)",
            "maxCpuLoras must be at least maxLoras",
            field_path=".maxCpuLoras",
        ),
    ),
    (
        ("loraModules", "enableLora"),
        rule(
            "!has(self.loraModules) || size(self.loraModules) == 0 || (has(self.enableLora) && self.enableLora)",
            "loraModules needs enableLora: true",
            field_path=".loraModules",
        ),
    ),
    (
        ("promptAdapters", "enablePromptAdapter"),
        rule(
            "!has(self.promptAdapters) || size(self.promptAdapters) == 0"
            " || (has(self.enablePromptAdapter) && self.enablePromptAdapter)",
            "promptAdapters needs enablePromptAdapter: true",
            field_path=".promptAdapters",
        ),
    ),
    (
        ("enableChunkedPrefill", "maxNumBatchedTokens", "maxModelLen"),
        rule(
            "!(has(self.enableChunkedPrefill) && !self.enableChunkedPrefill && "
            + _sizes("maxNumBatchedTokens", "maxModelLen")
            + f") || {_size('maxNumBatchedTokens')} >= {_size('maxModelLen')}",
            "maxNumBatchedTokens must be at least maxModelLen when enableChunkedPrefill is false",
            field_path=".maxNumBatchedTokens",
        ),
    ),
    (
        ("maxNumBatchedTokens", "maxNumSeqs"),
        rule(
            "!(" + _sizes("maxNumBatchedTokens") + " && has(self.maxNumSeqs))"
            f" || {_size('maxNumBatchedTokens')} >= double(self.maxNumSeqs)",
            "maxNumBatchedTokens must be at least maxNumSeqs",
            field_path=".maxNumBatchedTokens",
        ),
    ),
    (
        ("maxLongPartialPrefills", "maxNumPartialPrefills"),
        rule(
            "(has(self.maxLongPartialPrefills) ? self.maxLongPartialPrefills : 1)"
            " <= (has(self.maxNumPartialPrefills) ? self.maxNumPartialPrefills : 1)",
            "maxLongPartialPrefills must be at most maxNumPartialPrefills",
            field_path=".maxLongPartialPrefills",
        ),
    ),
    (
        ("maxNumPartialPrefills", "enableChunkedPrefill"),
        rule(
            "!has(self.maxNumPartialPrefills) || self.maxNumPartialPrefills <= 1"
            " || !has(self.enableChunkedPrefill) || self.enableChunkedPrefill",
            "maxNumPartialPrefills above 1 needs chunked prefill",
            field_path=".maxNumPartialPrefills",
        ),
    ),
    (
        ("asyncScheduling", "pipelineParallelSize"),
        rule(
            "!has(self.asyncScheduling) || !self.asyncScheduling"
            " || !has(self.pipelineParallelSize) || self.pipelineParallelSize <= 1",
            "asyncScheduling cannot be combined with pipelineParallelSize above 1",
            field_path=".asyncScheduling",
        ),
    ),
    (
        ("apiServerCount", "dataParallelSize"),
        rule(
            "!has(self.apiServerCount) || self.apiServerCount <= 1"
            " || !has(self.dataParallelSize) || self.dataParallelSize <= 1",
            "apiServerCount above 1 cannot be combined with dataParallelSize above 1 yet",
            field_path=".apiServerCount",
        ),
    ),
    (
        ("collectDetailedTraces", "otlpTracesEndpoint"),
        rule(
            "!has(self.collectDetailedTraces) || size(self.collectDetailedTraces) == 0 || has(self.otlpTracesEndpoint)",
            "collectDetailedTraces needs otlpTracesEndpoint",
            field_path=".otlpTracesEndpoint",
        ),
    ),
]


def engine_schema(args: Iterable[Arg]) -> Schema:
    properties = {camel(arg.dest): arg_schema(arg) for arg in engine_args(args)}
    rules = [
        validation for fields, validation in ENGINE_RULES if all(f in properties for f in fields)
    ]
    schema: Schema = {
        "type": "object",
        "description": "Server arguments of `infernetes serve` (vLLM's), as typed camelCase fields.",
        "properties": properties,
    }
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def engine_env_vars(env_vars: Iterable[EnvVar]) -> list[EnvVar]:
    """The VLLM_* run-time variables a user may set (secrets and build-time ones excluded)."""
    return [
        var
        for var in env_vars
        if var.name.startswith("VLLM_")
        and var.name not in OPERATOR_ENV
        and not var.secret
        and not var.build_time
    ]


def env_var_schema(var: EnvVar) -> Schema:
    kind = var.kind
    schema: Schema
    if kind == "bool":
        schema = {"type": "boolean"}
    elif kind == "int":
        schema = {"type": "integer"}
    elif kind == "float":
        schema = {"type": "number"}
    elif kind == "list":
        # Comma-separated in the environment; a list here.
        schema = {"type": "array", "items": {"type": "string", "maxLength": 1024}, "maxItems": 256}
    else:
        schema = {"type": "string", "maxLength": STRING_MAX}
    if var.choices:
        target = schema["items"] if kind == "list" else schema
        target["enum"] = list(var.choices)
    schema["description"] = var.help or var.name
    return schema


def engine_env_schema(env_vars: Iterable[EnvVar]) -> Schema:
    return {
        "type": "object",
        "description": "VLLM_* environment variables of the server, as typed fields named as the variable.",
        "properties": {var.name: env_var_schema(var) for var in engine_env_vars(env_vars)},
    }
