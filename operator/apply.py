"""Server-side apply of rendered objects under one field manager, and pruning of stale ones."""

from collections.abc import Iterable, Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.kube import APPLY_PATCH, KubeError, request

# The kinds the operator creates, with their REST collection names.
PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
}
# Kinds a change of spec can make unnecessary (the Deployment and Service always exist).
PRUNABLE = [
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
]


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


def prune(
    api: Any,
    *,
    name: str,
    namespace: str,
    owner_uid: str,
    keep: Iterable[Mapping[str, Any]],
    served: Iterable[tuple[str, str]],
) -> None:
    """Delete objects this resource owns that the current render no longer produces."""
    kept = {(m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in keep}
    selector = ",".join(f"{key}={value}" for key, value in names.common_labels(name).items())
    for api_version, kind in served:
        listing = request(
            api,
            "GET",
            collection_path(api_version, kind, namespace),
            query=[("labelSelector", selector)],
        )
        for item in (listing or {}).get("items", []):
            meta = item["metadata"]
            owned = any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or ())
            if owned and (api_version, kind, meta["name"]) not in kept:
                try:
                    request(
                        api,
                        "DELETE",
                        f"{collection_path(api_version, kind, namespace)}/{meta['name']}",
                    )
                except KubeError as exc:
                    if exc.status != 404:
                        raise
