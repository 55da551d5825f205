"""The InferenceService CustomResourceDefinition, built from the schema tables.

`build_crd()` is what `infernetes operator crd` prints and what `crds/` holds; a test fails when
the checked-in copy is stale.
"""

from typing import Any

import yaml
from infernetes.operator import names
from infernetes.operator.admission import (
    declare_keys,
    engine_refusals,
    env_refusals,
    key_refusals,
    narrow_with_cel,
)
from infernetes.operator.disaggregation import kv_cache_schema, prefill_rules, prefill_schema
from infernetes.operator.engine_schema import engine_env_schema, engine_schema
from infernetes.operator.multinode import multinode_rules
from infernetes.operator.openapi import Schema, array, integer, number, obj, rule, string
from infernetes.operator.spec_schema import (
    CACHE_RULES,
    GPU_VENDORS,
    MAX_SPLIT_TARGETS,
    PRE_STOP_SECONDS,
    PRECISE_ROUTING_RULES,
    ROOT_RULES,
    TERMINATION_GRACE_SECONDS,
    platform_properties,
    pre_stop_seconds_cel,
    resources_schema,
)
from infernetes.operator.status import MESSAGE_MAX

from infernetes.schema.args import ARGS
from infernetes.schema.env import ENV_VARS


def condition_schema() -> Schema:
    return obj(
        {
            "type": string(maxLength=64),
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": string(maxLength=128),
            "message": string(maxLength=MESSAGE_MAX),
            "lastTransitionTime": string(format="date-time"),
            "observedGeneration": integer(format="int64", minimum=0),
        },
        required=["type", "status"],
    )


def status_schema() -> Schema:
    conditions = array(condition_schema(), max_items=16)
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return obj(
        {
            "conditions": conditions,
            "observedGeneration": integer(format="int64"),
            "replicas": integer(format="int32"),
            "readyReplicas": integer(format="int32"),
            "selector": string("Label selector of the pods (for the scale subresource)."),
            "url": string("In-cluster URL of the OpenAI-compatible API."),
            "modelName": string("The model name clients send."),
            "gpusPerReplica": integer(),
            "serviceName": string(
                "Name of the Service (differs from the resource's when it would collide)."
            ),
            "prefill": obj(
                {
                    "replicas": integer(format="int32"),
                    "readyReplicas": integer(format="int32"),
                    "conditions": conditions,
                },
                description="The prefill role (spec.prefill): its replicas and its own Ready, "
                "Available, Progressing and Degraded.",
            ),
            "trafficSplit": array(
                obj(
                    {
                        "target": string(),
                        "model": string("The model name the picker rewrites requests to."),
                        "weight": integer(),
                        "percent": number("The target's share of the requests, in percent."),
                    }
                ),
                max_items=MAX_SPLIT_TARGETS,
                description="spec.routing.splits as the endpoint picker applies it (its "
                "InferenceModelRewrite); absent while none is.",
            ),
            "warnings": array(
                string(),
                max_items=256,
                description="Things the operator adjusted, then engine settings the runtime accepts without effect.",
            ),
        },
        description="Derived by the operator from the objects it owns.",
    )


# Below this, NCCL's buffers between the GPUs of one replica do not fit in /dev/shm.
MIN_SHM_MULTI_GPU = "1Gi"


def _gpu_limit_rules(gpus_needed: str, gpu_free_device: str) -> list[Schema]:
    """A GPU limit in spec.resources must cover the parallel sizes; a device without GPUs holds
    none (limits read as quantities: "4" and 4 alike)."""
    rules = []
    for resource in GPU_VENDORS.values():
        limit = f"self.resources.limits['{resource}']"
        has_limit = f"has(self.resources) && has(self.resources.limits) && '{resource}' in self.resources.limits"
        rules.append(
            rule(
                f"!({has_limit}) || {gpu_free_device} || "
                f"quantity(string({limit})).asInteger() >= {gpus_needed}",
                f"resources.limits {resource} must cover tensorParallelSize x "
                "pipelineParallelSize x dataParallelSize",
                field_path=".resources.limits",
            )
        )
    held = " || ".join(
        f"(has(self.resources.{section}) && '{res}' in self.resources.{section})"
        for res in GPU_VENDORS.values()
        for section in ("limits", "requests")
    )
    rules.append(
        rule(
            f"!{gpu_free_device} || !has(self.resources) || !({held})",
            "engine.device cpu runs without GPUs: resources must not request any",
            field_path=".resources",
        )
    )
    dra = "(has(self.gpu) && (has(self.gpu.deviceClassName) || has(self.gpu.resourceClaimTemplateName)))"
    rules.append(
        rule(
            f"!{dra} || !has(self.resources) || !({held})",
            "GPUs claimed through Dynamic Resource Allocation (gpu.deviceClassName or "
            "gpu.resourceClaimTemplateName) must not also be requested as a device-plugin "
            "resource in resources",
            field_path=".resources",
        )
    )
    rules.append(
        rule(
            f"!{dra} || !{gpu_free_device}",
            "engine.device cpu runs without GPUs: gpu.deviceClassName and "
            "gpu.resourceClaimTemplateName must be unset",
            field_path=".gpu",
        )
    )
    return rules


def spec_rules(engine_properties: dict[str, Any]) -> list[Schema]:
    """Rules across spec.gpu, spec.resources, spec.shmSize and spec.engine (only when the engine
    fields exist)."""
    rules: list[Schema] = []
    parallel = [
        f
        for f in ("tensorParallelSize", "pipelineParallelSize", "dataParallelSize")
        if f in engine_properties
    ]
    product = (
        " * ".join(
            f"(has(self.engine) && has(self.engine.{f}) ? self.engine.{f} : 1)" for f in parallel
        )
        or "1"
    )
    # Devices that take no GPU: cpu (the others the support table refuses, should one be allowed).
    gpu_free_device = (
        "(has(self.engine) && has(self.engine.device) && !(self.engine.device in ['auto', 'cuda']))"
        if "device" in engine_properties
        else "false"
    )
    rules.append(
        rule(
            f"!has(self.gpu) || !has(self.gpu.count) || self.gpu.count >= {product}"
            f" || (self.gpu.count == 0 && {gpu_free_device})",
            "gpu.count must cover tensorParallelSize x pipelineParallelSize x dataParallelSize "
            "(0 only with engine.device cpu)",
            field_path=".gpu.count",
        )
    )
    if "device" in engine_properties:
        rules.append(
            rule(
                f"!{gpu_free_device} || !has(self.gpu) || !has(self.gpu.count) || self.gpu.count == 0",
                "engine.device cpu runs without GPUs: gpu.count must be 0 or unset",
                field_path=".gpu.count",
            )
        )
    rules += _gpu_limit_rules(product, gpu_free_device)
    rules += multinode_rules(engine_properties)
    rules += CACHE_RULES
    rules += PRECISE_ROUTING_RULES
    gpus = f"(has(self.gpu) && has(self.gpu.count) ? self.gpu.count : {product})"
    rules.append(
        rule(
            f"!has(self.shmSize) || {gpu_free_device} || {gpus} <= 1 || "
            f"quantity(string(self.shmSize)).compareTo(quantity('{MIN_SHM_MULTI_GPU}')) >= 0",
            f"shmSize must be at least {MIN_SHM_MULTI_GPU} when a replica has more than one GPU "
            "(NCCL's buffers between them live in /dev/shm)",
            field_path=".shmSize",
        )
    )
    rules += _lora_rules()
    rules += prefill_rules(engine_properties)
    if "shutdownTimeout" in engine_properties:
        grace = f"(has(self.terminationGracePeriodSeconds) ? self.terminationGracePeriodSeconds : {TERMINATION_GRACE_SECONDS})"
        rules.append(
            rule(
                "!has(self.engine) || !has(self.engine.shutdownTimeout) || "
                f"self.engine.shutdownTimeout + {pre_stop_seconds_cel(grace)} < {grace}",
                "engine.shutdownTimeout must be less than terminationGracePeriodSeconds minus the "
                f"preStop sleep (a sixth of it, at most {PRE_STOP_SECONDS} s): the pod is killed "
                "when the grace period ends, cutting the drain short",
                field_path=".engine.shutdownTimeout",
            )
        )
    return rules


def _lora_rules() -> list[Schema]:
    """spec.lora against the engine's own LoRA fields and the model cache."""
    return [
        rule(
            "!has(self.lora) || !has(self.engine) || !has(self.engine.loraModules)",
            "list adapters in spec.lora or in spec.engine.loraModules, not both",
            field_path=".lora",
        ),
        rule(
            "!has(self.lora) || !has(self.engine) || !has(self.engine.enableLora) || "
            "self.engine.enableLora",
            "spec.lora serves adapters: engine.enableLora must not be false",
            field_path=".engine.enableLora",
        ),
        rule(
            "!has(self.lora) || !has(self.lora.maxRank) || !has(self.engine) || "
            "!has(self.engine.maxLoraRank)",
            "set the adapters' rank limit in lora.maxRank or engine.maxLoraRank, not both",
            field_path=".lora.maxRank",
        ),
        rule(
            "!has(self.lora) || has(self.modelCache) || "
            "!self.lora.adapters.exists(a, a.source.startsWith('cache://'))",
            "a cache:// adapter source needs spec.modelCache (the volume it is read from)",
            field_path=".lora.adapters",
        ),
    ]


def spec_schema() -> Schema:
    engine = engine_schema(ARGS)
    narrow_with_cel(engine, engine_refusals(ARGS))
    for field, refusals in key_refusals().items():
        declare_keys(engine["properties"][field], refusals)
        narrow_with_cel(engine["properties"][field], refusals)
    engine_env = engine_env_schema(ENV_VARS)
    narrow_with_cel(engine_env, env_refusals(ENV_VARS))
    properties = {
        **platform_properties(),
        "engine": engine,
        "engineEnv": engine_env,
        "prefill": prefill_schema(engine, resources_schema()),
        "kvCache": kv_cache_schema(),
    }
    return obj(properties, required=["model"], rules=spec_rules(engine["properties"]))


def printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Model", "type": "string", "jsonPath": ".status.modelName"},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        },
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {
            "name": "GPUs",
            "type": "integer",
            "jsonPath": ".status.gpusPerReplica",
            "description": "GPUs per replica",
        },
        {"name": "URL", "type": "string", "jsonPath": ".status.url"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_crd() -> dict[str, Any]:
    """The CRD as a dict, from the schema tables of infernetes.schema."""
    root = obj(
        {
            "apiVersion": string(),
            "kind": string(),
            # Declared so that the name rule can report its field path (metadata.name).
            "metadata": {"type": "object", "properties": {"name": string(maxLength=253)}},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        required=["spec"],
        rules=ROOT_RULES,
    )
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.CRD_NAME, "labels": {names.LABEL_NAME: "infernetes"}},
        "spec": {
            "group": names.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names.KIND,
                "listKind": f"{names.KIND}List",
                "plural": names.PLURAL,
                "singular": names.SINGULAR,
                "shortNames": list(names.SHORT_NAMES),
                "categories": ["all", "infernetes"],
            },
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": printer_columns(),
                }
            ],
        },
    }


def dump_yaml(documents: list[dict[str, Any]]) -> str:
    """Stable YAML (key order as built, wide lines) for the checked-in files."""
    header = "# Generated by `infernetes operator crd` (make generate). Do not edit.\n"
    body = "---\n".join(
        yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=False)
        for doc in documents
    )
    return header + body


def crd_yaml() -> str:
    return dump_yaml([build_crd()])
