"""Prefill/decode disaggregation (spec.prefill) and the KV offload tier (spec.kvCache.offload):
what the two roles share, what each role's engine gets, and the admission rules.

With spec.prefill the resource runs two workloads of one model: `<name>-prefill` (engines with
the NixlConnector as `kv_producer`) and the decode one (`kv_consumer`, as before named `<name>`).
Each decode pod runs llm-d's routing sidecar in front of its engine: the endpoint picker (llm-d's
inference scheduler in P/D mode) picks a decode pod and a prefill pod for each request and names
the prefill pod in a header; the sidecar sends the request there first (max_tokens 1,
`kv_transfer_params.do_remote_decode`), then to its own engine with the parameters the prefill
engine returned, and the decode engine reads the prompt's KV blocks over NIXL (vLLM's protocol,
docs/disaggregation.md). A failed prefill read is recomputed by the decode engine.
"""

import re
from collections.abc import Mapping
from typing import Any

from infernetes.operator.engine_schema import camel, engine_args
from infernetes.operator.openapi import Schema, enum, integer, number, obj, rule

from infernetes.schema.args import ARGS

PREFILL = "prefill"
DECODE = "decode"
# llm-d's role label: its picker's prefill-filter and decode-filter select pods by it.
ROLE_LABEL = "llm-d.ai/role"
NIXL_CONNECTOR = "NixlConnector"
KV_ROLES = {PREFILL: "kv_producer", DECODE: "kv_consumer"}
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
DEFAULT_SIDE_CHANNEL_PORT = 5600  # vLLM's (infernetes/schema/env.py)
SIDE_CHANNEL_PORT_NAME = "nixl"
OFFLOAD_TIERS = ["cpu"]
# Engine fields that choose the weights or the KV cache's layout: both roles must agree on them
# (the decode engine reads the prefill engine's blocks as its own), so they are set once, in
# spec.engine, never in spec.prefill.engine.
SHARED_ENGINE_FIELDS = (
    "revision",
    "codeRevision",
    "tokenizer",
    "tokenizerRevision",
    "tokenizerMode",
    "hfConfigPath",
    "hfOverrides",
    "trustRemoteCode",
    "loadFormat",
    "quantization",
    "dtype",
    "kvCacheDtype",
    "blockSize",
    "calculateKvScales",
    "kvCacheDtypeSkipLayers",
    "mambaCacheDtype",
    "mambaSsmCacheDtype",
    "mambaBlockSize",
    "device",
)
# What the operator sets on both roles' engines with spec.prefill.
OPERATOR_ENGINE_FIELDS = ("kvTransferConfig", "kvOffloadingSize", "kvOffloadingBackend")
# What a role tunes apart from the other (its batch budget, its cache's size and policy,
# compilation, logs and traces): spec.prefill.engine holds these config groups' fields only.
# The rest (the model, the frontend, parallelism) is both roles', set in spec.engine; a copy of
# the whole engine schema would also take the CRD past the 256 KiB that `kubectl apply` can store.
ROLE_ARG_GROUPS = ("SchedulerConfig", "CacheConfig", "VllmConfig", "ObservabilityConfig")


def kv_cache_schema() -> Schema:
    return obj(
        {
            "offload": obj(
                {
                    "sizeGiB": number(
                        "Host memory for the tier, in GiB, across the engine's ranks "
                        "(--kv-offloading-size).",
                        minimum=0,
                        exclusiveMinimum=True,
                    ),
                    "tier": enum(
                        OFFLOAD_TIERS,
                        "Where offloaded blocks go: cpu, the host's memory (vLLM's native "
                        "OffloadingConnector, --kv-offloading-backend native).",
                        default="cpu",
                    ),
                },
                required=["sizeGiB"],
                description="A KV-cache tier below the engine's own: computed and evicted blocks "
                "are written to it, and a prefix-cache miss found there is loaded back instead "
                "of recomputed (docs/kv_offload.md). The pod's memory request should cover it.",
            )
        },
        description="The engines' KV cache beyond the device.",
    )


def role_engine_fields() -> list[str]:
    """The engine fields spec.prefill.engine may set (ROLE_ARG_GROUPS, less what is shared)."""
    unsettable = {*SHARED_ENGINE_FIELDS, *OPERATOR_ENGINE_FIELDS}
    return [
        camel(arg.dest)
        for arg in engine_args(ARGS)
        if arg.group in ROLE_ARG_GROUPS and camel(arg.dest) not in unsettable
    ]


def role_engine_schema(engine: Schema) -> Schema:
    """spec.engine's schema cut to role_engine_fields(), with the object rules on those alone."""
    kept = set(role_engine_fields())
    schema = {
        **engine,
        "properties": {k: v for k, v in engine["properties"].items() if k in kept},
        "description": "Engine settings of the prefill role, merged field by field over "
        "spec.engine: scheduling, the KV cache's size and policy, compilation, logs and "
        "traces (" + ", ".join(ROLE_ARG_GROUPS) + "); the rest is both roles', in spec.engine.",
    }
    rules = [
        item
        for item in engine.get("x-kubernetes-validations", [])
        if set(re.findall(r"self\.(\w+)", item["rule"])) <= kept
    ]
    schema.pop("x-kubernetes-validations", None)
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def prefill_schema(engine: Schema, resources: Schema) -> Schema:
    """spec.prefill: `engine` holds the role's own engine fields (merged over spec.engine)."""
    return obj(
        {
            "replicas": integer(
                "Prefill replicas (the autoscaler, if any, scales the decode replicas).",
                minimum=0,
                maximum=1000,
                default=1,
            ),
            "resources": resources,
            "engine": role_engine_schema(engine),
        },
        description="A prefill role beside the decode one (KServe's LLMInferenceService "
        "spec.prefill): a Deployment <name>-prefill whose engines compute prompts and hand "
        "their KV cache to the decode engines over NIXL (the NixlConnector, kv_producer; the "
        "decode role is kv_consumer). Each decode pod runs llm-d's routing sidecar, and the "
        "endpoint picker (spec.routing, llm-d's inference scheduler) picks a prefill pod for "
        "each request. CPU engines only (the NixlConnector moves a CPU engine's cache).",
    )


def _unset(path: str, field: str) -> str:
    return f"!has(self.{path}) || !has(self.{path}.{field})"


def prefill_rules(engine_properties: Mapping[str, Any]) -> list[Schema]:
    """spec.prefill and spec.kvCache against the rest of the spec (only the engine fields that
    exist are named)."""
    with_prefill = "!has(self.prefill) || "
    rules = [
        rule(
            with_prefill + "has(self.routing)",
            "spec.prefill needs spec.routing: the endpoint picker (llm-d's inference "
            "scheduler in P/D mode) picks each request's prefill pod",
            field_path=".routing",
        ),
        rule(
            with_prefill + "(has(self.engine) && has(self.engine.device) && "
            "self.engine.device == 'cpu')",
            "spec.prefill needs engine.device cpu: the NixlConnector moves a CPU engine's KV "
            "cache; registering a CUDA cache with NIXL is not built yet",
            field_path=".engine.device",
        ),
        rule(
            "!has(self.prefill) || !has(self.kvCache) || !has(self.kvCache.offload)",
            "spec.kvCache.offload with spec.prefill is not supported: an engine runs one KV "
            "connector, and combining the host tier with the NixlConnector is not built",
            field_path=".kvCache.offload",
        ),
    ]
    # Fields outside role_engine_fields() are not in spec.prefill.engine's schema at all (the
    # API server refuses them as unknown), so only spec.engine's are ruled on here.
    dp = "dataParallelSize"
    if dp in engine_properties:
        rules.append(
            rule(
                with_prefill + f"{_unset('engine', dp)} || self.engine.{dp} <= 1",
                "spec.prefill with engine.dataParallelSize above 1 is not built: llm-d's "
                "sidecar and picker address data-parallel ranks by ports the engines do not open",
                field_path=f".engine.{dp}",
            )
        )
    for field in OPERATOR_ENGINE_FIELDS:
        if field in engine_properties:
            rules.append(
                rule(
                    with_prefill + _unset("engine", field),
                    f"with spec.prefill the operator sets engine.{field} (the NixlConnector, "
                    "kv_producer or kv_consumer by role): leave it unset",
                    field_path=f".engine.{field}",
                )
            )
    rules.append(
        rule(
            with_prefill + f"!has(self.engineEnv) || !has(self.engineEnv.{SIDE_CHANNEL_HOST})",
            f"with spec.prefill the operator sets engineEnv.{SIDE_CHANNEL_HOST} (each pod's "
            "own address): leave it unset",
            field_path=f".engineEnv.{SIDE_CHANNEL_HOST}",
        )
    )
    for field in ("kvTransferConfig", "kvOffloadingSize"):
        if field in engine_properties:
            rules.append(
                rule(
                    "!has(self.kvCache) || !has(self.kvCache.offload) || "
                    + _unset("engine", field),
                    f"spec.kvCache.offload sets the engine's KV connector: leave "
                    f"engine.{field} unset",
                    field_path=f".engine.{field}",
                )
            )
    return rules
