"""A replica across nodes: how it is placed, and the LeaderWorkerSet that runs it.

Each replica is a group of `size` pods, one per node, each holding a node's GPUs: the leader
(node rank 0) serves the API, the workers run their ranks headless. The LWS controller creates
the groups, a headless Service per group, and (its pod webhook) puts LWS_LEADER_ADDRESS,
LWS_WORKER_INDEX and LWS_GROUP_SIZE in every container's env, which the args read through
Kubernetes' $(VAR) expansion. torch.distributed meets at the leader's address on MASTER_PORT.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import LWS_GV, ClusterFacts
from infernetes.operator.multinode import LWS_KIND
from infernetes.operator.render.dra import uses_dra
from infernetes.operator.render.workload import (
    container_args,
    gpu_resource,
    gpus_per_replica,
    pod_spec,
)

MASTER_PORT = 29501
ROLE_LABEL = f"{names.GROUP}/role"
LEADER, WORKER = "leader", "worker"


@dataclass(frozen=True)
class Layout:
    """Pods per replica (1: a Deployment's pod) and the GPUs each pod holds."""

    nodes: int
    gpus_per_pod: int

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def _size(engine: Mapping[str, Any], field: str) -> int:
    return int(engine.get(field) or 1)


def gpus_per_node(spec: Mapping[str, Any], facts: ClusterFacts) -> tuple[int | None, str]:
    """(GPUs per node, where that number comes from); None when unknown."""
    explicit = (spec.get("gpu") or {}).get("perNode")
    if explicit is not None:
        return int(explicit), "spec.gpu.perNode"
    resource = gpu_resource(spec)
    return (facts.gpus_per_node or {}).get(resource), f"the largest node's {resource}"


RAY_ACROSS_NODES = (
    "a replica that spans nodes runs its ranks with engine.distributedExecutorBackend mp (one "
    "pod per node, a LeaderWorkerSet); ray would need a Ray cluster across those pods"
)


def layout(spec: Mapping[str, Any], facts: ClusterFacts) -> Layout:
    """How one replica is placed; ValueError for a size that cannot be split across nodes
    (admission refuses the same when spec.gpu.perNode is set)."""
    engine = spec.get("engine") or {}
    gpus = gpus_per_replica(spec)
    per_node, source = gpus_per_node(spec, facts)
    model_parallel = _size(engine, "tensorParallelSize") * _size(engine, "pipelineParallelSize")
    if not gpus or uses_dra(spec) or not per_node or model_parallel <= per_node:
        return Layout(1, gpus)
    if model_parallel % per_node:
        raise ValueError(
            f"tensorParallelSize x pipelineParallelSize ({model_parallel} GPUs) exceeds one node "
            f"({per_node} GPUs, {source}) and is not a multiple of it: a replica spans whole "
            "nodes, one pod per node"
        )
    if _size(engine, "dataParallelSize") > 1:
        raise ValueError(
            "a replica that spans nodes takes engine.dataParallelSize 1 (scale with replicas)"
        )
    if engine.get("distributedExecutorBackend", "mp") != "mp":
        raise ValueError(RAY_ACROSS_NODES)
    return Layout(math.ceil(model_parallel / per_node), per_node)


def node_args(nodes: int, role: str) -> list[str]:
    """The multi-node arguments after the usual argv: the leader is node rank 0 and serves; a
    worker takes its rank from LWS_WORKER_INDEX and serves no API."""
    rank = "0" if role == LEADER else "$(LWS_WORKER_INDEX)"
    args = [
        "--nnodes",
        str(nodes),
        "--node-rank",
        rank,
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        str(MASTER_PORT),
    ]
    return args if role == LEADER else [*args, "--headless"]


def _template(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    *,
    name: str,
    role: str,
    nodes: int,
    gpus: int,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    pod = pod_spec(spec, facts, name, gpus)
    container = pod["containers"][0]
    container["args"] = [*container_args(spec, facts), *node_args(nodes, role)]
    if role == WORKER:
        # A worker serves no HTTP: no port, nothing to probe (a dead worker fails the group's
        # collective, which the leader's probes see, and LWS restarts the group).
        for field in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
            container.pop(field, None)
    labels = {**(spec.get("podLabels") or {}), **names.common_labels(name), ROLE_LABEL: role}
    metadata: dict[str, Any] = {"labels": labels}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, "spec": pod}


def rollout(spec: Mapping[str, Any]) -> dict[str, Any]:
    """RollingUpdate surges a whole group (nodes' worth of GPUs) only when asked to; Auto and
    Recreate replace one group at a time."""
    strategy = (spec.get("rollout") or {}).get("strategy", "Auto")
    surge, unavailable = (1, 0) if strategy == "RollingUpdate" else (0, 1)
    return {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": surge, "maxUnavailable": unavailable},
    }


def leaderworkerset_manifest(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    placement: Layout,
    *,
    name: str,
    namespace: str,
    pod_annotations: Mapping[str, str],
) -> dict[str, Any]:
    labels = names.common_labels(name)
    user_annotations = dict(spec.get("podAnnotations") or {})

    def template(role: str, annotations: Mapping[str, str]) -> dict[str, Any]:
        return _template(
            spec,
            facts,
            name=name,
            role=role,
            nodes=placement.nodes,
            gpus=placement.gpus_per_pod,
            annotations=annotations,
        )

    return {
        "apiVersion": LWS_GV,
        "kind": LWS_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": spec.get("replicas", 1),
            # Workers start once the leader pod exists (its address resolves for them).
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": rollout(spec),
            "leaderWorkerTemplate": {
                "size": placement.nodes,
                # torch.distributed cannot take a rank back: one pod restarting restarts its group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(LEADER, {**user_annotations, **pod_annotations}),
                "workerTemplate": template(WORKER, user_annotations),
            },
        },
    }
