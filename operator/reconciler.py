"""The reconciler: one level-based pass per InferenceService, from whatever event woke it.

A pass renders the desired children, compares them with the newest copies the operator holds
(`drift.stale_fields`), applies only those that differ (server-side apply), deletes owned children
the render no longer produces, then derives the status and writes it when it changed. Any event
(the resource, a child changed or deleted, a pod, optional APIs appearing) queues the same pass,
so repairing drift and following the spec are one code path. The kopf handlers only feed the
caches and the queue (handlers.py).

Failures: a spec that cannot be rendered, or a child the API server refuses, sets Degraded
(reason InvalidSpec / ReconcileError, the API's message) and Ready False; the apply is retried
with exponential backoff (1 s doubling to 5 min) unless the spec changes; `observedGeneration`
stays at the last generation whose children were all applied.
"""

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from infernetes.operator import metrics, names
from infernetes.operator.apply import apply, delete, overwrite_spec
from infernetes.operator.argv import EngineSpecError
from infernetes.operator.cache import Children, GpuLedger, Key, Newest, child_id
from infernetes.operator.discovery import OPTIONAL_GROUP_VERSIONS, discover_apis
from infernetes.operator.drift import differences, scaled_by_others, stale_fields, with_hash
from infernetes.operator.engine_support import review_engine
from infernetes.operator.facts import KEDA_GV, LWS_GV, ClusterFacts
from infernetes.operator.gpus import too_large_for_any_node
from infernetes.operator.kube import MERGE_PATCH, KubeError, request
from infernetes.operator.multinode import LWS_KIND, LWS_MISSING, as_deployment_view
from infernetes.operator.render import Plan, plan
from infernetes.operator.render.model_cache import held_workload
from infernetes.operator.render.workload import gpu_resource, model_source
from infernetes.operator.status import (
    Observed,
    Verdict,
    derive_status,
    progress_only,
    same_status,
    transitions,
)
from infernetes.operator.workqueue import WorkQueue

log = logging.getLogger("infernetes.operator")

# Passes at once. A pass mostly waits on the API server, and a burst of creates must not queue
# one resource's Deployment behind another's Service (creating Services is the API server's
# slowest write here: a cluster IP each, and endpoint slices made for it), so there are many.
WORKERS = 256
STATUS_WORKERS = 4
API_THREADS = 64
# Applies of the children that are not the workload, at once: more only waits longer at the API
# server and holds API threads the next resources' Deployments need.
SECONDARY_APPLIES = 8
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0
# Child events are gathered this long before a pass (a rollout makes many).
CHILD_DELAY_SECONDS = 0.2
# A pass's status is written this long after it, off the path that creates children, once for
# the passes of a burst.
STATUS_DELAY_SECONDS = 0.5
# A change that only says how far a rollout has got (status.progress_only) is written this long
# after it was first seen, with whatever came meanwhile: a pod scheduled, then ready, is one
# write, not two. Ready, Degraded, a new generation or an error are written at once.
PROGRESS_SETTLE_SECONDS = 5.0
# At start-up, the first listing of the resources waits this long for the children's listings.
STARTUP_DELAY_SECONDS = 1.0
REDISCOVER_SECONDS = 60.0
REDISCOVER_AFTER_CRD_SECONDS = (1.0, 4.0)
# The same event (reason and message) about the same resource is told once in this window.
EVENT_WINDOW_SECONDS = 600.0
LEGACY_FINALIZER = f"{names.GROUP}/finalizer"
# Access modes that let one node (or one pod) mount a claim; a claim's are asked again after this.
SINGLE_NODE_ACCESS = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})
CLAIM_CHECK_SECONDS = 60.0
TOO_LARGE = "TooLargeForAnyNode"  # a replica needs more GPUs than any node has


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Outcome:
    """What the last pass did, for the status written after it."""

    applied: Plan | None  # the render, when all of its children were applied
    error: tuple[str, str] | None
    ignored: list[str]  # engine settings without effect (engine_support.review_engine)
    unshared: list[str]  # claims the replicas cannot mount together (unshared_claims)
    autoscaling: Verdict | None = None  # the Autoscaling condition (render.autoscaling)
    rendered: Mapping[str, Verdict] | None = None  # render.Plan.conditions


@dataclass(frozen=True)
class Retry:
    generation: int
    at: float  # loop time
    delay: float
    error: tuple[str, str]


class Reconciler:
    def __init__(self, api: Any, *, default_image: str | None) -> None:
        self.api = api
        self.default_image = default_image
        self.resources = Newest()
        self.children = Children()
        self.gpus = GpuLedger()
        self.headroom = asyncio.Lock()
        self.discovered: frozenset[str] = frozenset()
        self.withdrawn: set[str] = set()
        self.failures: dict[Key, int] = {}
        self.retries: dict[Key, Retry] = {}
        self.told: dict[tuple, float] = {}
        self.queue = WorkQueue()
        self.status_queue = WorkQueue()
        self.outcomes: dict[Key, Outcome] = {}
        self.status_locks: dict[Key, asyncio.Lock] = {}
        self.progress_seen: dict[Key, float] = {}  # loop time a progress-only change was first seen
        self.claims: dict[tuple[str, str], tuple[float, list[str] | None]] = {}
        self.pool = ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api")
        self.secondary = asyncio.Semaphore(SECONDARY_APPLIES)
        self.tasks: list[asyncio.Task] = []
        self._rediscover: asyncio.Task | None = None

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.discovered = await self.call(discover_apis, self.api)
        log.info("optional APIs served: %s", ", ".join(sorted(self.apis)) or "none")
        self.tasks = [
            *(asyncio.create_task(self._work(self.queue, self.reconcile)) for _ in range(WORKERS)),
            *(
                asyncio.create_task(self._work(self.status_queue, self.refresh_status))
                for _ in range(STATUS_WORKERS)
            ),
        ]
        self.tasks.append(asyncio.create_task(self._rediscover_periodically()))

    async def stop(self) -> None:
        tasks = [*self.tasks, *([self._rediscover] if self._rediscover else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: function(*args, **kwargs))

    # --- events (from the kopf handlers) ------------------------------------------------------

    def resource_event(self, event: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if event == "DELETED":
            self.resources.remove(key, body)
            self.forget(key)
        else:
            self.resources.observe(key, body)
            self.queue.add(key, STARTUP_DELAY_SECONDS if event is None else 0.0)
        metrics.MANAGED.set(len(self.resources))

    def child_event(self, event: str | None, body: dict[str, Any]) -> None:
        key = self.children.observe(body, deleted=event == "DELETED")
        if self.resources.get(key) is not None:
            self.queue.add(key, CHILD_DELAY_SECONDS)

    def pod_event(self, event: str | None, body: Mapping[str, Any]) -> None:
        deleted = event == "DELETED"
        self.gpus.observe_pod(body, deleted)
        labels = body["metadata"].get("labels") or {}
        if labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY:
            key = self.children.observe_pod(body, deleted)
            if self.resources.get(key) is not None:
                self.queue.add(key, CHILD_DELAY_SECONDS)

    def node_event(self, event: str | None, body: Mapping[str, Any]) -> None:
        self.gpus.observe_node(body, deleted=event == "DELETED")
        for key, outcome in self.outcomes.items():
            # A node may fit it now (or, GPUs per node being the largest node's, need no LWS).
            if outcome.error and outcome.error[0] in (TOO_LARGE, LWS_MISSING):
                self.queue.add(key, CHILD_DELAY_SECONDS)

    def crd_event(self, event: str | None, body: dict[str, Any]) -> None:
        """A CRD of an optional group changed: one being deleted stops counting at once (the API
        server refuses new objects of it while it is served still); discover again once the
        burst of events is over, and once more a little later."""
        spec = body.get("spec") or {}
        kinds = {
            f"{spec.get('group')}/{version.get('name')}/{(spec.get('names') or {}).get('kind')}"
            for version in spec.get("versions") or ()
        }
        if body["metadata"].get("deletionTimestamp") and not kinds <= self.withdrawn:
            self.withdrawn |= kinds
            self._served_changed()
        elif not body["metadata"].get("deletionTimestamp") and event != "DELETED":
            self.withdrawn -= kinds
        if self._rediscover is not None:
            self._rediscover.cancel()

        async def later() -> None:
            for delay in REDISCOVER_AFTER_CRD_SECONDS:
                await asyncio.sleep(delay)
                await self.rediscover()

        self._rediscover = asyncio.create_task(later())

    def forget(self, key: Key) -> None:
        self.children.forget(key)
        self.gpus.reserved.pop(key, None)
        self.failures.pop(key, None)
        self.retries.pop(key, None)
        self.queue.forget(key)
        self.status_queue.forget(key)
        self.outcomes.pop(key, None)
        self.status_locks.pop(key, None)
        self.progress_seen.pop(key, None)

    # --- discovery ----------------------------------------------------------------------------

    @property
    def apis(self) -> frozenset[str]:
        """Optional APIs served ("group/version/Kind"), less those whose CRD is being deleted."""
        return self.discovered - self.withdrawn

    async def rediscover(self) -> None:
        try:
            discovered = await self.call(discover_apis, self.api)
        except KubeError as exc:
            log.warning("discovery failed: %s", exc)
            return
        if discovered != self.discovered:
            self.discovered = discovered
            self._served_changed()

    def _served_changed(self) -> None:
        log.info("optional APIs served: %s", ", ".join(sorted(self.apis)) or "none")
        for key in self.resources:
            self.queue.add(key)

    async def _rediscover_periodically(self) -> None:
        while True:
            await asyncio.sleep(REDISCOVER_SECONDS)
            await self.rediscover()

    # --- the pass -----------------------------------------------------------------------------

    async def _work(self, queue: Any, handle: Any) -> None:
        while True:
            key = await queue.get()
            try:
                await handle(key)
            except Exception:
                log.exception("%s of %s/%s failed", handle.__name__, *key)
                queue.add(key, self._backoff(key))
            finally:
                queue.done(key)

    def _backoff(self, key: Key) -> float:
        failures = self.failures.get(key, 0)
        self.failures[key] = failures + 1
        return min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2**failures)

    def facts(self, spare: Mapping[str, int] | None) -> ClusterFacts:
        kwargs: dict[str, Any] = {
            "apis": self.apis,
            "spare_gpus": spare,
            "gpus_per_node": self.gpus.largest(),
        }
        if self.default_image:
            kwargs["default_image"] = self.default_image
        return ClusterFacts(**kwargs)

    async def desired(self, key: Key, resource: Mapping[str, Any]) -> Plan:
        """The render, with the Deployment's rollout strategy decided only when its pod template
        changes (then under the headroom lock, reserving a surge pod's GPUs)."""
        namespace, name = key
        spec, uid = resource.get("spec") or {}, resource["metadata"]["uid"]
        live = self.children.of(key).get(("apps/v1", "Deployment", name))
        result = plan(spec, self.facts(self.gpus.spare()), name=name, namespace=namespace, uid=uid)
        self._hold_for_download(key, result)
        workload = result.manifests[0]
        if workload["kind"] != "Deployment":
            # A LeaderWorkerSet rolls out by its own strategy (render.leaderworkerset.rollout).
            live_lws = self.children.of(key).get((LWS_GV, LWS_KIND, name))
            if live_lws is not None and scaled_by_others(live_lws):
                workload["spec"].pop("replicas", None)
            result.manifests = [with_hash(manifest) for manifest in result.manifests]
            return result
        deployment = workload
        if live is not None and not differences(
            deployment["spec"]["template"], live["spec"]["template"]
        ):
            # No rollout is coming: keep the strategy decided when the last one started.
            deployment["spec"]["strategy"] = live["spec"].get("strategy")
        elif live is not None and result.gpus_per_replica:
            async with self.headroom:
                spare = self.gpus.spare(excluding=key)
                result = plan(spec, self.facts(spare), name=name, namespace=namespace, uid=uid)
                self._hold_for_download(key, result)
                deployment = result.manifests[0]
                strategy = deployment["spec"]["strategy"]
                surge = (strategy.get("rollingUpdate") or {}).get("maxSurge", 0)
                if strategy["type"] == "RollingUpdate" and surge:
                    self.gpus.reserved[key] = {gpu_resource(spec): result.gpus_per_replica}
                else:
                    self.gpus.reserved.pop(key, None)
        if live is not None and scaled_by_others(live):
            # An HPA (or KEDA, or `kubectl scale`) owns replicas through the scale subresource.
            del deployment["spec"]["replicas"]
        result.manifests = [with_hash(manifest) for manifest in result.manifests]
        return result

    def _hold_for_download(self, key: Key, result: Plan) -> None:
        """Hold the workload until the model-cache Job for this model has succeeded."""
        held, verdict = held_workload(result.manifests, self.children.of(key), result.model_name)
        if verdict is not None:
            result.conditions["ModelCached"] = verdict
        if held is not None:
            result.held.add(held)

    async def reconcile(self, key: Key) -> None:
        resource = self.resources.get(key)
        if resource is None or resource["metadata"].get("deletionTimestamp"):
            return
        started = time.monotonic()
        await self._drop_legacy_finalizer(key, resource)
        error: tuple[str, str] | None = None
        spec = resource.get("spec") or {}
        try:
            result: Plan | None = await self.desired(key, resource)
        except (EngineSpecError, KeyError, TypeError, ValueError) as exc:
            result, error = None, ("InvalidSpec", f"cannot render the spec: {exc}")
            metrics.RECONCILES.labels("invalid").inc()
        if result is not None and result.blocked:
            # No workload this cluster can run (no LeaderWorkerSet API): nothing is applied until
            # the API appears (discovery queues a pass then).
            error, result = result.blocked, None
            metrics.RECONCILES.labels("invalid").inc()
        if result is not None and (
            why := too_large_for_any_node(self.gpus.nodes, gpu_resource(spec), result.gpus_per_pod)
        ):
            # Rather than a pod that stays Pending: nothing is applied until a node fits.
            result, error = None, (TOO_LARGE, why)
            metrics.RECONCILES.labels("invalid").inc()
        notes = Outcome(
            None,
            None,
            result.ignored if result else review_engine(spec).ignored,
            await self.unshared_claims(key, spec) if result else [],
        )
        applied = False
        if result is not None:
            applied, error = await self._converge(key, resource, result, notes)
        self._release_headroom(key)
        self.outcomes[key] = Outcome(
            result if applied else None,
            error,
            notes.ignored,
            notes.unshared,
            result.autoscaling if result else None,
            result.conditions if result else None,
        )
        self.status_queue.add(key, STATUS_DELAY_SECONDS)
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    async def refresh_status(self, key: Key) -> None:
        """Write the status the last pass and the children's current state call for."""
        resource, outcome = self.resources.get(key), self.outcomes.get(key)
        if resource is None or outcome is None or resource["metadata"].get("deletionTimestamp"):
            return
        await self.write_status(key, resource, outcome)

    async def _converge(
        self, key: Key, resource: Mapping[str, Any], result: Plan, notes: Outcome
    ) -> tuple[bool, tuple[str, str] | None]:
        """Apply what differs and prune what is no longer rendered: (applied, error); `notes`
        are for the status written before a repair."""
        generation = resource["metadata"].get("generation", 0)
        uid = resource["metadata"]["uid"]
        live = self.children.of(key)
        wanted = {child_id(m): m for m in result.manifests}
        work = [
            (m, why)
            for m in result.manifests
            if child_id(m) not in result.held and (why := stale_fields(m, live.get(child_id(m))))
        ]
        for cid, obj in list(live.items()):
            if (
                obj["apiVersion"] in OPTIONAL_GROUP_VERSIONS
                and f"{obj['apiVersion']}/{obj['kind']}" not in self.apis
            ):
                # Deleted with its CRD; the watch of its kind has ended without saying so.
                self.children.drop(obj)
                del live[cid]
        extra = [
            obj
            for cid, obj in live.items()
            if cid not in wanted
            and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ())
        ]
        if not work and not extra:
            self.failures.pop(key, None)
            self.retries.pop(key, None)
            metrics.RECONCILES.labels("unchanged").inc()
            return True, None
        retry = self.retries.get(key)
        loop = asyncio.get_running_loop()
        if retry is not None and retry.generation == generation and loop.time() < retry.at:
            return False, retry.error  # backing off: the queue holds the retry
        observed = (resource.get("status") or {}).get("observedGeneration")
        # Drift: a child someone deleted or edited (not a new render, not a child appearing
        # because an optional API did).
        deleted = self.children.deleted(key)
        drifted = [
            f"{m['kind']} {m['metadata']['name']}: " + ", ".join(why[:3])
            for m, why in work
            if why != ["render changed"] and (why != ["missing"] or child_id(m) in deleted)
        ]
        if drifted and observed == generation:
            log.info("%s/%s: repairing %s", *key, "; ".join(drifted))
            await self.write_status(key, resource, notes, stale=drifted)
        target: Mapping[str, Any] = {}
        try:
            for target, why in work:
                edited = why[0].startswith(".")
                if target is result.manifests[0]:  # the workload goes first, never waiting
                    response = await self._apply(target, edited=edited)
                else:
                    async with self.secondary:
                        response = await self._apply(target, edited=edited)
                self.children.observe(response)
            for target in extra:
                await self.call(delete, self.api, target)
                metrics.API_WRITES.labels(target["kind"], "delete").inc()
                self.children.observe(target, deleted=True)
        except KubeError as exc:
            if target["apiVersion"] in OPTIONAL_GROUP_VERSIONS and await self._gone(target):
                # Its objects go with its CRD (no watch event will say so): render again.
                self.children.drop(target)
                self.queue.add(key)
                return False, None
            what = f"{target['kind']} {target['metadata']['name']}"
            delay = self._backoff(key)
            # The message stays the same from one attempt to the next: one status write, one event.
            error = ("ReconcileError", f"applying {what}: {exc.message}")
            self.retries[key] = Retry(generation, loop.time() + delay, delay, error)
            self.queue.add(key, delay)
            metrics.RECONCILES.labels("error").inc()
            log.warning("%s/%s: %s (retry in %.0fs)", *key, error[1], delay)
            return False, error
        self.failures.pop(key, None)
        self.retries.pop(key, None)
        metrics.RECONCILES.labels("applied").inc()
        log.info("reconciled %s/%s generation %s", *key, generation)
        return True, None

    async def unshared_claims(self, key: Key, spec: Mapping[str, Any]) -> list[str]:
        """The claims of a resource with several replicas that only one node can attach
        (ReadWriteOnce, ReadWriteOncePod): admission cannot see a claim's access modes."""
        replicas = spec.get("replicas", 1)
        if replicas <= 1:
            return []
        namespace, _ = key
        claims = [("spec.model", model_source(spec).claim)]
        claims.append(
            ("spec.modelCache.claimName", (spec.get("modelCache") or {}).get("claimName"))
        )
        notes = []
        for field, claim in claims:
            modes = await self._access_modes(namespace, claim) if claim else None
            if modes and set(modes) <= SINGLE_NODE_ACCESS:
                notes.append(
                    f"{field}: PersistentVolumeClaim {claim} is {', '.join(modes)}: the {replicas} "
                    "replicas can only mount it on one node; use a ReadWriteMany or ReadOnlyMany "
                    "claim, or one replica"
                )
        return notes

    async def _access_modes(self, namespace: str, claim: str) -> list[str] | None:
        """A claim's access modes, asked again after CLAIM_CHECK_SECONDS (None: no such claim)."""
        now = asyncio.get_running_loop().time()
        checked = self.claims.get((namespace, claim))
        if checked is not None and now - checked[0] < CLAIM_CHECK_SECONDS:
            return checked[1]
        path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
        try:
            found = await self.call(request, self.api, "GET", path)
            modes = list((found.get("spec") or {}).get("accessModes") or [])
        except KubeError as exc:
            if exc.status != 404:
                raise
            modes = None
        self.claims[(namespace, claim)] = (now, modes)
        return modes

    async def _gone(self, manifest: Mapping[str, Any]) -> bool:
        """After a failed write: has the kind's optional API gone (its CRD deleted or being so)?"""
        kind = f"{manifest['apiVersion']}/{manifest['kind']}"
        if kind not in self.apis:
            return True
        await self.rediscover()
        return kind not in self.apis

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

    def _release_headroom(self, key: Key) -> None:
        """A rollout that finished no longer needs the GPUs promised to its surge pod."""
        if key not in self.gpus.reserved:
            return
        _, name = key
        live = self.children.of(key).get(("apps/v1", "Deployment", name))
        if live is None:
            self.gpus.reserved.pop(key, None)
            return
        seen = Observed(live["spec"].get("replicas", 1), live, ())
        replicas = seen.count("replicas")
        if (
            seen.deployment_current
            and seen.count("updatedReplicas") == replicas == seen.desired_replicas
        ):
            self.gpus.reserved.pop(key, None)

    async def _drop_legacy_finalizer(self, key: Key, resource: Mapping[str, Any]) -> None:
        """Earlier releases put a finalizer on every resource; nothing needs it any more."""
        finalizers = resource["metadata"].get("finalizers") or []
        if LEGACY_FINALIZER not in finalizers:
            return
        namespace, name = key
        body = {
            "metadata": {
                "finalizers": [f for f in finalizers if f != LEGACY_FINALIZER],
                "resourceVersion": resource["metadata"]["resourceVersion"],
            }
        }
        path = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}"
        response = await self.call(
            request, self.api, "PATCH", path, body=body, content_type=MERGE_PATCH
        )
        self.resources.observe(key, response)

    # --- status and events --------------------------------------------------------------------

    async def write_status(
        self,
        key: Key,
        resource: Mapping[str, Any],
        outcome: Outcome,
        stale: list[str] | None = None,
    ) -> None:
        """Derive the status; write it only when something a user sees changed."""
        async with self.status_locks.setdefault(key, asyncio.Lock()):
            await self._write_status(key, resource, outcome, stale or [])

    async def _write_status(
        self, key: Key, resource: Mapping[str, Any], outcome: Outcome, stale: list[str]
    ) -> None:
        applied, error = outcome.applied, outcome.error
        namespace, name = key
        current = self.resources.get(key) or resource
        status = dict(current.get("status") or {})
        generation = current["metadata"].get("generation", 0)
        spec = current.get("spec") or {}
        deployment = self.workload(key)
        desired_replicas = spec.get("replicas", 1)
        if deployment is not None and scaled_by_others(deployment):
            desired_replicas = deployment["spec"].get("replicas", desired_replicas)
        new: dict[str, Any] = {}
        if applied is not None:
            new = {
                "observedGeneration": generation,
                "url": applied.url,
                "modelName": applied.model_name,
                "gpusPerReplica": applied.gpus_per_replica,
                "serviceName": applied.service_name,
                "selector": applied.selector,
                "warnings": applied.warnings or None,
            }
        new.update(
            derive_status(
                generation=generation,
                desired_replicas=desired_replicas,
                deployment=deployment,
                pods=self.children.pods(key),
                previous=status.get("conditions"),
                now=now(),
                ignored_settings=outcome.ignored,
                unshared_claims=outcome.unshared,
                autoscaling=outcome.autoscaling,
                autoscaler=self._autoscaler(key, outcome),
                rendered=outcome.rendered,
                reconcile_error=error,
                stale_children=stale,
            )
        )
        unchanged = same_status(status, new) and all(
            status.get(field) == value for field, value in new.items() if field != "conditions"
        )
        if unchanged:
            self.progress_seen.pop(key, None)
            return
        if progress_only(status, new):
            loop_now = asyncio.get_running_loop().time()
            due = self.progress_seen.setdefault(key, loop_now) + PROGRESS_SETTLE_SECONDS
            if loop_now < due:
                self.status_queue.add(key, due - loop_now)
                return
        self.progress_seen.pop(key, None)
        path = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}/status"
        try:
            response = await self.call(
                request, self.api, "PATCH", path, body={"status": new}, content_type=MERGE_PATCH
            )
        except KubeError as exc:
            if exc.status == 404:
                return
            raise
        metrics.API_WRITES.labels(names.KIND, "status").inc()
        metrics.STATUS_UPDATES.inc()
        self.resources.observe(key, response)
        told = (
            []
            if applied is None
            else [w for w in applied.warnings if w not in (status.get("warnings") or ())]
        )
        for warning in told:
            reason = "SettingIgnored" if warning in applied.ignored else "Adjusted"  # type: ignore[union-attr]
            await self.event(current, "Warning", reason, warning)
        for kind, reason, message in transitions(status.get("conditions"), new["conditions"]):
            await self.event(current, kind, reason, message)

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

    async def event(
        self, resource: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        """Post an event, once per reason and message in EVENT_WINDOW_SECONDS."""
        meta = resource["metadata"]
        told_key = (meta["namespace"], meta["name"], reason, message)
        stamp = time.monotonic()
        if stamp - self.told.get(told_key, -EVENT_WINDOW_SECONDS) < EVENT_WINDOW_SECONDS:
            return
        self.told = {k: t for k, t in self.told.items() if stamp - t < EVENT_WINDOW_SECONDS}
        self.told[told_key] = stamp
        timestamp = now()
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": names.FIELD_MANAGER},
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "count": 1,
        }
        try:
            await self.call(
                request,
                self.api,
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/events",
                body=body,
            )
        except KubeError as exc:
            log.warning("could not post event %s: %s", reason, exc)
            return
        metrics.API_WRITES.labels("Event", "create").inc()
