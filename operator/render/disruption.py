"""The PodDisruptionBudget: with more than one replica, a drain or an upgrade of the nodes takes
at most one replica away at a time (one replica alone gets none: it would block every drain).

The budget counts pods, also for a replica that is a LeaderWorkerSet group of several pods: the
first pod evicted takes its whole group down (the group is recreated on a pod's restart), whose
pods then count as unavailable and hold every further eviction until the group is back, so a
drain still takes one group at a time."""

from collections.abc import Mapping
from typing import Any

from infernetes.operator import names


def disruption_budget(spec: Mapping[str, Any], *, name: str, namespace: str) -> list[dict]:
    if spec.get("replicas", 1) <= 1:
        return []
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": names.common_labels(name)},
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": names.selector_labels(name)},
                # A pod that never became ready (crash loop, no GPU) may always be evicted.
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
    ]
