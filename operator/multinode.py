"""Serving one replica across nodes: what admission refuses, the condition while the
LeaderWorkerSet API is missing, and the LeaderWorkerSet's status as status.py reads it.

A replica whose tensor x pipeline parallel GPUs exceed one node's runs as a group of pods, one
per node, each holding a node's GPUs: a LeaderWorkerSet (render/leaderworkerset.py decides the
layout and renders it), whose controller creates the groups and tells each pod its leader's
address.
"""

from collections.abc import Mapping
from typing import Any

from infernetes.operator.facts import LWS_GV
from infernetes.operator.openapi import Schema, rule

LWS_KIND = "LeaderWorkerSet"
LWS_MISSING = "LeaderWorkerSetMissing"


def missing_api(nodes: int) -> tuple[str, str]:
    """The (reason, message) while a replica needs nodes but the LWS API is not served."""
    return (
        LWS_MISSING,
        f"a replica spans {nodes} nodes, which needs a LeaderWorkerSet ({LWS_GV}), but the "
        "cluster does not serve that API: install the LeaderWorkerSet controller "
        "(https://lws.sigs.k8s.io), or fit a replica on one node; nothing is deployed until then",
    )


def as_deployment_view(lws: Mapping[str, Any]) -> dict[str, Any]:
    """The LeaderWorkerSet's status in the Deployment's terms that status.py reads: a replica
    is a group, ready when all of its pods are (the LWS controller counts them so)."""
    status = lws.get("status") or {}
    ready = status.get("readyReplicas") or 0
    return {
        "metadata": {"generation": (lws.get("metadata") or {}).get("generation", 0)},
        "spec": {"replicas": (lws.get("spec") or {}).get("replicas", 1)},
        "status": {
            "observedGeneration": status.get("observedGeneration", 0),
            "replicas": status.get("replicas") or 0,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": status.get("updatedReplicas") or 0,
            "conditions": [
                dict(item)
                for item in status.get("conditions") or ()
                if item.get("type") == "Available"
            ],
        },
    }


def multinode_rules(engine_properties: Mapping[str, Any]) -> list[Schema]:
    """Admission rules on spec.gpu.perNode against the engine's parallel sizes."""
    if "tensorParallelSize" not in engine_properties:
        return []
    sizes = [f for f in ("tensorParallelSize", "pipelineParallelSize") if f in engine_properties]
    model_parallel = " * ".join(
        f"(has(self.engine) && has(self.engine.{f}) ? self.engine.{f} : 1)" for f in sizes
    )
    per_node = "self.gpu.perNode"
    fits = f"!has(self.gpu) || !has(self.gpu.perNode) || {model_parallel} <= {per_node}"
    rules = [
        rule(
            f"{fits} || ({model_parallel}) % {per_node} == 0",
            "tensorParallelSize x pipelineParallelSize must fit in gpu.perNode GPUs or be a "
            "multiple of it (a replica spans whole nodes, one pod per node)",
            field_path=".gpu.perNode",
        ),
        rule(
            f"{fits} || !has(self.gpu.count) || self.gpu.count == {model_parallel}",
            "gpu.count of a replica that spans nodes must equal tensorParallelSize x "
            "pipelineParallelSize (each pod takes gpu.perNode)",
            field_path=".gpu.count",
        ),
    ]
    if "dataParallelSize" in engine_properties:
        rules.append(
            rule(
                f"{fits} || !has(self.engine.dataParallelSize) || self.engine.dataParallelSize == 1",
                "a replica that spans nodes (tensorParallelSize x pipelineParallelSize above "
                "gpu.perNode) takes engine.dataParallelSize 1: scale with replicas",
                field_path=".engine.dataParallelSize",
            )
        )
    if "distributedExecutorBackend" in engine_properties:
        rules.append(
            rule(
                f"{fits} || !has(self.engine) || !has(self.engine.distributedExecutorBackend) || "
                "self.engine.distributedExecutorBackend == 'mp'",
                "a replica that spans nodes (tensorParallelSize x pipelineParallelSize above "
                "gpu.perNode) runs its ranks with engine.distributedExecutorBackend mp: ray "
                "would need a Ray cluster across its pods",
                field_path=".engine.distributedExecutorBackend",
            )
        )
    if "device" in engine_properties:
        rules.append(
            rule(
                "!has(self.gpu) || !has(self.gpu.perNode) || !has(self.engine) || "
                "!has(self.engine.device) || self.engine.device in ['auto', 'cuda']",
                "gpu.perNode places GPUs: engine.device cpu takes none",
                field_path=".gpu.perNode",
            )
        )
    return rules
