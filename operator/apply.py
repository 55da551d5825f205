"""Server-side apply of rendered objects under one field manager, and deletion of stale ones."""

from collections.abc import Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.kube import APPLY_PATCH, MERGE_PATCH, KubeError, request

# The kinds the operator creates, with their REST collection names.
PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobjects",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproutes",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("batch/v1", "Job"): "jobs",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
}


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{PLURALS[(api_version, kind)]}"


def object_path(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    return f"{collection_path(manifest['apiVersion'], manifest['kind'], meta['namespace'])}/{meta['name']}"


def apply(api: Any, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Create or update `manifest`; fields it omits that we set before are removed."""
    return request(
        api,
        "PATCH",
        object_path(manifest),
        query=[("fieldManager", names.FIELD_MANAGER), ("force", "true")],
        body=manifest,
        content_type=APPLY_PATCH,
    )


def overwrite_spec(api: Any, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Put `manifest`'s spec over the live one with a JSON merge patch, which replaces lists whole.

    For an edit that server-side apply cannot undo: apply merges lists by key, so a Service port
    someone renumbered stays beside ours, and the two clash on their name.
    """
    return request(
        api,
        "PATCH",
        object_path(manifest),
        query=[("fieldManager", names.FIELD_MANAGER)],
        body={"spec": manifest["spec"]},
        content_type=MERGE_PATCH,
    )


def delete(api: Any, manifest: Mapping[str, Any]) -> None:
    """Delete the object `manifest` names; one already gone is fine."""
    try:
        request(api, "DELETE", object_path(manifest))
    except KubeError as exc:
        if exc.status != 404:
            raise
