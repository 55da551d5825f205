"""spec.routing.splits -> an InferenceModelRewrite: the endpoint picker sends a weighted share of
the requests for the served model name to other names its pods serve (this service's LoRA
adapters), by rewriting each request's `model` before it picks a pod.

The Gateway API Inference Extension's picker (v1.3 on; v1.5.0 is the one rendered) reads the
InferenceModelRewrites of its pool (inference.networking.x-k8s.io/v1alpha2) and draws each
request's target with probability weight / sum of weights. A rewrite reaches only the pods of
the picker's own pool, so every target is a name this service serves: itself (its served model
name) or one of spec.lora's adapters, which admission checks.
"""

from collections.abc import Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import INFERENCE_POOL_GV, MODEL_REWRITE_GV

REWRITE_KIND = "InferenceModelRewrite"


def split_models(
    routing: Mapping[str, Any], *, name: str, served_name: str
) -> list[dict[str, Any]]:
    """Each split target with the model name requests are rewritten to and its share, as
    status shows them."""
    splits = routing.get("splits") or []
    total = sum(int(item["weight"]) for item in splits)
    return [
        {
            "target": item["target"],
            "model": served_name if item["target"] == name else item["target"],
            "weight": int(item["weight"]),
            "percent": round(100 * int(item["weight"]) / total, 1),
        }
        for item in splits
    ]


def model_rewrite(
    routing: Mapping[str, Any], *, name: str, namespace: str, served_name: str
) -> dict[str, Any]:
    """The rewrite of `served_name` into the split's models, for the pool `name`. Targets of
    weight 0 are left out (the API's weights start at 1): they get no requests either way."""
    targets = [
        {"modelRewrite": item["model"], "weight": item["weight"]}
        for item in split_models(routing, name=name, served_name=served_name)
        if item["weight"] > 0
    ]
    return {
        "apiVersion": MODEL_REWRITE_GV,
        "kind": REWRITE_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": names.common_labels(name)},
        "spec": {
            "poolRef": {
                "group": INFERENCE_POOL_GV.split("/")[0],
                "kind": "InferencePool",
                "name": name,
            },
            "rules": [
                {
                    "matches": [{"model": {"type": "Exact", "value": served_name}}],
                    "targets": targets,
                }
            ],
        },
    }


def describe(split: list[dict[str, Any]]) -> str:
    return ", ".join(f"{item['model']} {item['percent']:g}%" for item in split)
