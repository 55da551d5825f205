"""The InferenceService CustomResourceDefinition, built from the schema tables.

`build_crd()` is what `infernetes operator crd` prints and what `crds/` holds; a test fails when
the checked-in copy is stale.
"""

from typing import Any

import yaml
from infernetes.operator import names
from infernetes.operator.admission import engine_refusals, env_refusals, narrow_with_cel
from infernetes.operator.engine_schema import engine_env_schema, engine_schema
from infernetes.operator.openapi import Schema, array, integer, obj, rule, string
from infernetes.operator.spec_schema import (
    ROOT_RULES,
    TERMINATION_GRACE_SECONDS,
    platform_properties,
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
            "warnings": array(
                string(),
                max_items=256,
                description="Things the operator adjusted, then engine settings the runtime accepts without effect.",
            ),
        },
        description="Derived by the operator from the objects it owns.",
    )


def spec_rules(engine_properties: dict[str, Any]) -> list[Schema]:
    """Rules across spec.gpu and spec.engine (only when the engine fields exist)."""
    rules: list[Schema] = []
    parallel = [
        f
        for f in ("tensorParallelSize", "pipelineParallelSize", "dataParallelSize")
        if f in engine_properties
    ]
    if parallel:
        product = " * ".join(
            f"(has(self.engine) && has(self.engine.{f}) ? self.engine.{f} : 1)" for f in parallel
        )
        rules.append(
            rule(
                f"!has(self.gpu) || !has(self.gpu.count) || self.gpu.count == 0 || self.gpu.count >= {product}",
                "gpu.count must cover tensorParallelSize x pipelineParallelSize x dataParallelSize",
                field_path=".gpu.count",
            )
        )
    if "device" in engine_properties:
        rules.append(
            rule(
                "!(has(self.engine) && has(self.engine.device) && self.engine.device == 'cpu')"
                " || !has(self.gpu) || !has(self.gpu.count) || self.gpu.count == 0",
                "engine.device cpu runs without GPUs: gpu.count must be 0 or unset",
                field_path=".gpu.count",
            )
        )
    if "shutdownTimeout" in engine_properties:
        grace = f"(has(self.terminationGracePeriodSeconds) ? self.terminationGracePeriodSeconds : {TERMINATION_GRACE_SECONDS})"
        rules.append(
            rule(
                f"!has(self.engine) || !has(self.engine.shutdownTimeout) || self.engine.shutdownTimeout < {grace}",
                "engine.shutdownTimeout must be less than terminationGracePeriodSeconds: the pod is killed "
                "when the grace period ends, cutting the drain short",
                field_path=".engine.shutdownTimeout",
            )
        )
    return rules


def spec_schema() -> Schema:
    engine = engine_schema(ARGS)
    narrow_with_cel(engine, engine_refusals(ARGS))
    engine_env = engine_env_schema(ENV_VARS)
    narrow_with_cel(engine_env, env_refusals(ENV_VARS))
    properties = {**platform_properties(), "engine": engine, "engineEnv": engine_env}
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
            "metadata": {"type": "object"},
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
