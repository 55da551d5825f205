"""GPU headroom from node and pod summaries: could a surge pod get its GPUs right now, and does
a replica's pod fit on any node at all?

The GpuLedger keeps the summaries from the watches and the GPUs promised to the surge pods of
rollouts under way; `rollout: Auto` decides from them under its lock (reconciler.desired).
"""

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from infernetes.operator.cache import Key
from infernetes.operator.spec_schema import GPU_VENDORS
from infernetes.operator.status import Observed

GPU_RESOURCES = tuple(GPU_VENDORS.values())
TOO_LARGE = "TooLargeForAnyNode"  # a replica needs more GPUs than any node has


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def too_large_for_any_node(
    nodes: Mapping[str, Mapping[str, int]], resource: str, per_replica: int
) -> str | None:
    """Why one pod of a replica cannot be placed on any node, or None when some node is large
    enough or no GPU node is known yet (a replica across nodes asks this for each of its pods)."""
    largest = max((gpus.get(resource, 0) for gpus in nodes.values()), default=0)
    if not largest or per_replica <= largest:
        return None
    return (
        f"a replica needs {per_replica} {resource} (tensor x pipeline x data parallel size) on "
        f"one node, but the largest node has {largest}; spec.gpu.perNode set to the nodes' GPUs "
        "spreads it over nodes (tensor x pipeline parallel size a multiple of it)"
    )


def node_gpus(allocatable: Mapping[str, Any]) -> dict[str, int]:
    return {res: _count(allocatable[res]) for res in GPU_RESOURCES if res in allocatable}


def pod_gpus(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """GPUs a pod holds: device plugins take limits (= requests) per container."""
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or ():
        resources = container.get("resources") or {}
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for res in GPU_RESOURCES:
            if res in amounts:
                total[res] = total.get(res, 0) + _count(amounts[res])
    return total


def spare_gpus(
    nodes: Mapping[str, Mapping[str, int]],
    used_by_node: Mapping[str, Iterable[Mapping[str, int]]],
    reserved: Iterable[Mapping[str, int]] = (),
) -> dict[str, int]:
    """The most GPUs of each resource free on any one node, after `reserved` surge pods (each
    placed, largest first, on the node with the most free) have taken theirs."""
    free: dict[str, dict[str, int]] = {}
    for node, capacity in nodes.items():
        used: dict[str, int] = {}
        for pod in used_by_node.get(node, ()):
            for res, count in pod.items():
                used[res] = used.get(res, 0) + count
        free[node] = {res: count - used.get(res, 0) for res, count in capacity.items()}
    for claim in sorted(reserved, key=lambda c: -sum(c.values())):
        for res, count in claim.items():
            best = max(free, key=lambda n: free[n].get(res, 0), default=None)
            if best is not None and free[best].get(res, 0) >= count:
                free[best][res] -= count
    spare: dict[str, int] = {}
    for per_node in free.values():
        for res, count in per_node.items():
            spare[res] = max(spare.get(res, 0), count)
    return spare


class GpuLedger:
    """GPUs per node, the pods holding them, and the GPUs promised to surge pods of rollouts that
    the operator started and that have not finished: `rollout: Auto` decides from all three."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, int]] = {}
        self.pods: dict[str, tuple[str, dict[str, int]]] = {}
        self.reserved: dict[Key, dict[str, int]] = {}
        # Held while a rollout's strategy is decided and its surge pod's GPUs promised.
        self.lock = asyncio.Lock()

    def observe_node(self, node: Mapping[str, Any], deleted: bool = False) -> None:
        name = node["metadata"]["name"]
        gpus = node_gpus((node.get("status") or {}).get("allocatable") or {})
        if deleted or not gpus or (node.get("spec") or {}).get("unschedulable"):
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = gpus

    def observe_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        gpus = pod_gpus(spec)
        finished = status.get("phase") in ("Succeeded", "Failed")
        if deleted or finished or not gpus or not spec.get("nodeName"):
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = (spec["nodeName"], gpus)

    def largest(self) -> dict[str, int]:
        """The GPUs of the largest schedulable node, per resource (GPUs per node by default)."""
        largest: dict[str, int] = {}
        for gpus in self.nodes.values():
            for res, count in gpus.items():
                largest[res] = max(largest.get(res, 0), count)
        return largest

    def spare(self, excluding: Key | None = None) -> dict[str, int]:
        used: dict[str, list[dict[str, int]]] = {}
        for node, gpus in self.pods.values():
            used.setdefault(node, []).append(gpus)
        claims = [claim for key, claim in self.reserved.items() if key != excluding]
        return spare_gpus(self.nodes, used, claims)

    def reserve(self, key: Key, deployment: Mapping[str, Any], resource: str, gpus: int) -> None:
        """Promise a surge pod's GPUs to the rollout `deployment` starts (none without a surge)."""
        strategy = deployment["spec"]["strategy"]
        surge = (strategy.get("rollingUpdate") or {}).get("maxSurge", 0)
        if strategy["type"] == "RollingUpdate" and surge:
            self.reserved[key] = {resource: gpus}
        else:
            self.reserved.pop(key, None)

    def release(self, key: Key, live: Mapping[str, Any] | None) -> None:
        """A rollout that finished (or whose Deployment went) no longer needs the GPUs promised
        to its surge pod."""
        if key not in self.reserved:
            return
        if live is None:
            self.reserved.pop(key, None)
            return
        seen = Observed(live["spec"].get("replicas", 1), live, ())
        replicas = seen.count("replicas")
        if (
            seen.deployment_current
            and seen.count("updatedReplicas") == replicas == seen.desired_replicas
        ):
            self.reserved.pop(key, None)
