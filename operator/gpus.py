"""GPU headroom from node and pod summaries: could a surge pod get its GPUs right now?"""

from collections.abc import Iterable, Mapping
from typing import Any

from infernetes.operator.spec_schema import GPU_VENDORS

GPU_RESOURCES = tuple(GPU_VENDORS.values())


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
