"""The applier: server-side apply of rendered objects under one field manager ("infernetes"),
pruning of the children this resource owns (by owner reference) that the render no longer
produces, and reading a child back (a GET, for the reconciler's recheck of a service not Ready).

A pass applies its workloads at once and its other children SECONDARY_APPLIES at a time; which
children are stale is drift.py's question, when to retry the reconciler's.
"""

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from infernetes.operator import metrics, names
from infernetes.operator.cache import ChildId
from infernetes.operator.kube import APPLY_PATCH, MERGE_PATCH, Call, KubeError, request

log = logging.getLogger("infernetes.operator")

# Applies of the children that are not the workload, at once: more only waits longer at the API
# server and holds API threads the next resources' Deployments need.
SECONDARY_APPLIES = 8

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
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"): "inferencemodelrewrites",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("batch/v1", "Job"): "jobs",
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): "resourceclaimtemplates",
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


def read(api: Any, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The live object `manifest` names; None when it is gone."""
    try:
        return request(api, "GET", object_path(manifest))
    except KubeError as exc:
        if exc.status != 404:
            raise
        return None


def unrendered(
    live: Mapping[ChildId, dict[str, Any]], rendered: Iterable[ChildId], uid: str
) -> list[dict[str, Any]]:
    """The live children owned by the resource `uid` that the render no longer produces."""
    wanted = set(rendered)
    return [
        obj
        for cid, obj in live.items()
        if cid not in wanted
        and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ())
    ]


class Applier:
    def __init__(self, api: Any, call: Call) -> None:
        self.api = api
        self.call = call
        self.secondary = asyncio.Semaphore(SECONDARY_APPLIES)

    async def apply(
        self, manifest: Mapping[str, Any], *, edited: bool, workload: bool
    ) -> dict[str, Any]:
        """Apply one child: a workload at once, never waiting behind other resources' children."""
        if workload:
            return await self._apply(manifest, edited=edited)
        async with self.secondary:
            return await self._apply(manifest, edited=edited)

    async def delete(self, manifest: Mapping[str, Any]) -> None:
        await self.call(delete, self.api, manifest)
        metrics.API_WRITES.labels(manifest["kind"], "delete").inc()

    async def read(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """The child as the API server holds it now (None when it is gone); writes nothing."""
        return await self.call(read, self.api, manifest)

    async def _apply(self, manifest: Mapping[str, Any], *, edited: bool) -> dict[str, Any]:
        """Server-side apply; an edited child whose edit apply cannot merge back (the API server
        refuses the merge) gets its spec overwritten first."""
        kind = manifest["kind"]
        try:
            response = await self.call(apply, self.api, manifest)
        except KubeError as exc:
            if not (edited and exc.status == 422):
                raise
            log.info(
                "%s %s: apply refused (%s); overwriting its spec",
                kind,
                manifest["metadata"]["name"],
                exc.message,
            )
            await self.call(overwrite_spec, self.api, manifest)
            metrics.API_WRITES.labels(kind, "overwrite").inc()
            response = await self.call(apply, self.api, manifest)
        metrics.API_WRITES.labels(kind, "apply").inc()
        return response
