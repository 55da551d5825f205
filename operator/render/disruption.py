"""The PodDisruptionBudget: with more than one replica, a drain or an upgrade of the nodes takes
at most one replica away at a time (one replica alone gets none: it would block every drain)."""

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
