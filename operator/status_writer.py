"""The status writer: an InferenceService's status from the last pass's Outcome and its live
children (derived by status.py), written only when something a user sees changed.

A change that only says how far a rollout has got (status.progress_only: replica counts,
messages, Progressing/Available/Scheduled moving on) waits up to PROGRESS_SETTLE_SECONDS to be
written with the next one; Ready, Degraded, a new generation, an error or a warning are written at
once. A write tells its new warnings and its conditions' transitions as events (events.py).
"""

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infernetes.operator import metrics, names
from infernetes.operator.cache import Children, Key, Newest
from infernetes.operator.disaggregation import PREFILL, ROLE_LABEL
from infernetes.operator.drift import scaled_by_others
from infernetes.operator.events import EventRecorder
from infernetes.operator.facts import KEDA_GV, LWS_GV
from infernetes.operator.kube import MERGE_PATCH, Call, KubeError, now, request
from infernetes.operator.multinode import LWS_KIND, as_deployment_view
from infernetes.operator.render import Plan
from infernetes.operator.render.workload import workload_name
from infernetes.operator.status import (
    Verdict,
    derive_status,
    progress_only,
    role_status,
    same_status,
    transitions,
)
from infernetes.operator.workqueue import WorkQueue

# A change that only says how far a rollout has got (status.progress_only) is written this long
# after it was first seen, with whatever came meanwhile: a pod scheduled, then ready, is one
# write, not two. Ready, Degraded, a new generation or an error are written at once.
PROGRESS_SETTLE_SECONDS = 5.0


@dataclass(frozen=True)
class Outcome:
    """What the last pass did, for the status written after it."""

    applied: Plan | None  # the render, when all of its children were applied
    error: tuple[str, str] | None
    ignored: list[str]  # engine settings without effect (engine_support.review_engine)
    unshared: list[str]  # claims the replicas cannot mount together (claims.py)
    autoscaling: Verdict | None = None  # the Autoscaling condition (render.autoscaling)
    rendered: Mapping[str, Verdict] | None = None  # render.Plan.conditions


class StatusWriter:
    def __init__(
        self,
        api: Any,
        call: Call,
        *,
        resources: Newest,
        children: Children,
        queue: WorkQueue,
        recorder: EventRecorder,
    ) -> None:
        self.api = api
        self.call = call
        self.resources = resources
        self.children = children
        self.queue = queue  # where a held progress-only change comes back when it is due
        self.recorder = recorder
        self.locks: dict[Key, asyncio.Lock] = {}
        self.progress_seen: dict[Key, float] = {}  # loop time a progress-only change was first seen
        self.conditions = metrics.CONDITIONS

    def forget(self, key: Key) -> None:
        self.locks.pop(key, None)
        self.progress_seen.pop(key, None)
        self.conditions.forget(key)

    async def write(
        self,
        key: Key,
        resource: Mapping[str, Any],
        outcome: Outcome,
        stale: list[str] | None = None,
    ) -> None:
        """Derive the status; write it only when something a user sees changed."""
        async with self.locks.setdefault(key, asyncio.Lock()):
            await self._write(key, resource, outcome, stale or [])

    async def _write(
        self, key: Key, resource: Mapping[str, Any], outcome: Outcome, stale: list[str]
    ) -> None:
        current = self.resources.get(key) or resource
        status = dict(current.get("status") or {})
        new = self._derive(key, current, status, outcome, stale)
        if not self._due(key, status, new):
            # Unchanged or held (progress only): the metric says what the API holds.
            self.conditions.set(key, status.get("conditions"))
        elif await self._patch(key, new):
            self.conditions.set(key, new["conditions"])
            await self._tell(current, status, new, outcome.applied)

    def _derive(
        self,
        key: Key,
        current: Mapping[str, Any],
        status: Mapping[str, Any],
        outcome: Outcome,
        stale: list[str],
    ) -> dict[str, Any]:
        """The status the last pass and the live children call for."""
        generation = current["metadata"].get("generation", 0)
        spec = current.get("spec") or {}
        deployment = self.workload(key)
        desired_replicas = spec.get("replicas", 1)
        if deployment is not None and scaled_by_others(deployment):
            desired_replicas = deployment["spec"].get("replicas", desired_replicas)
        new: dict[str, Any] = {}
        if outcome.applied is not None:
            applied = outcome.applied
            new = {
                "observedGeneration": generation,
                "url": applied.url,
                "modelName": applied.model_name,
                "gpusPerReplica": applied.gpus_per_replica,
                "serviceName": applied.service_name,
                "selector": applied.selector,
                "warnings": applied.warnings or None,
                "trafficSplit": applied.traffic_split or None,
            }
        pods = self.children.pods(key)
        prefill_pods = [pod for pod in pods if _role(pod) == PREFILL]
        new.update(
            derive_status(
                generation=generation,
                desired_replicas=desired_replicas,
                deployment=deployment,
                pods=[pod for pod in pods if _role(pod) != PREFILL],
                previous=status.get("conditions"),
                now=now(),
                ignored_settings=outcome.ignored,
                unshared_claims=outcome.unshared,
                autoscaling=outcome.autoscaling,
                autoscaler=self._autoscaler(key, outcome),
                rendered=outcome.rendered,
                reconcile_error=outcome.error,
                stale_children=stale,
            )
        )
        prefill = spec.get("prefill")
        if prefill:
            new["prefill"] = role_status(
                generation=generation,
                desired_replicas=prefill.get("replicas", 1),
                deployment=self.children.of(key).get(
                    ("apps/v1", "Deployment", workload_name(key[1], PREFILL))
                ),
                pods=prefill_pods,
                previous=(status.get("prefill") or {}).get("conditions"),
                now=now(),
            )
        elif status.get("prefill"):
            new["prefill"] = None  # the role is gone (a merge patch's null removes it)
        return new

    def _due(self, key: Key, status: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """Whether to write now: never when nothing a user sees changed, and a progress-only
        change once it has settled (the queue brings the key back then)."""
        unchanged = same_status(status, new) and all(
            status.get(field) == value for field, value in new.items() if field != "conditions"
        )
        if unchanged:
            self.progress_seen.pop(key, None)
            return False
        if progress_only(status, new):
            loop_now = asyncio.get_running_loop().time()
            due = self.progress_seen.setdefault(key, loop_now) + PROGRESS_SETTLE_SECONDS
            if loop_now < due:
                self.queue.add(key, due - loop_now)
                return False
        self.progress_seen.pop(key, None)
        return True

    async def _patch(self, key: Key, new: dict[str, Any]) -> bool:
        """Write the status; False when the resource is gone."""
        namespace, name = key
        path = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}/status"
        try:
            response = await self.call(
                request, self.api, "PATCH", path, body={"status": new}, content_type=MERGE_PATCH
            )
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        metrics.API_WRITES.labels(names.KIND, "status").inc()
        metrics.STATUS_UPDATES.inc()
        self.resources.observe(key, response)
        return True

    async def _tell(
        self,
        current: Mapping[str, Any],
        status: Mapping[str, Any],
        new: Mapping[str, Any],
        applied: Plan | None,
    ) -> None:
        """The written status's new warnings and its conditions' transitions, as events."""
        if applied is not None:
            for warning in applied.warnings:
                if warning not in (status.get("warnings") or ()):
                    reason = "SettingIgnored" if warning in applied.ignored else "Adjusted"
                    await self.recorder.event(current, "Warning", reason, warning)
        for kind, reason, message in transitions(status.get("conditions"), new["conditions"]):
            await self.recorder.event(current, kind, reason, message)

    def workload(self, key: Key) -> dict[str, Any] | None:
        """The live Deployment, or the LeaderWorkerSet in the Deployment's terms."""
        children = self.children.of(key)
        deployment = children.get(("apps/v1", "Deployment", key[1]))
        lws = children.get((LWS_GV, LWS_KIND, key[1]))
        if deployment is None and lws is not None:
            view = as_deployment_view(lws)
            view["metadata"]["managedFields"] = lws["metadata"].get("managedFields")
            return view
        return deployment

    def _autoscaler(self, key: Key, outcome: Outcome) -> dict[str, Any] | None:
        """The live autoscaler the last render chose (its reason names its kind)."""
        if outcome.autoscaling is None:
            return None
        kind = outcome.autoscaling[1]
        api_version = {
            "ScaledObject": KEDA_GV,
            "HorizontalPodAutoscaler": "autoscaling/v2",
        }.get(kind)
        return self.children.of(key).get((api_version, kind, key[1])) if api_version else None


def _role(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("metadata", {}).get("labels") or {}).get(ROLE_LABEL)
