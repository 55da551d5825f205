"""The reconciler: one level-based pass per InferenceService, from whatever event woke it.

A pass renders the desired children, compares them with the newest copies the operator holds
(`drift.stale_fields`), applies only those that differ and prunes owned children the render no
longer produces (apply.py), then queues the status, which the status writer derives and writes
when it changed (status_writer.py). Any event (the resource, a child changed or deleted, a pod,
optional APIs appearing: discovery.py) queues the same pass, so repairing drift and following the
spec are one code path. The kopf handlers only feed the caches and the queue (handlers.py).
Before applying, a pass checks what the cluster can hold: GPUs (gpus.py) and claims (claims.py).

Failures: a spec that cannot be rendered, or a child the API server refuses, sets Degraded
(reason InvalidSpec / ReconcileError, the API's message) and Ready False; the apply is retried
with exponential backoff (1 s doubling to 5 min) unless the spec changes; `observedGeneration`
stays at the last generation whose children were all applied.
"""

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from infernetes.operator import metrics, names
from infernetes.operator.apply import Applier, unrendered
from infernetes.operator.argv import EngineSpecError
from infernetes.operator.cache import Children, Key, Newest, child_id
from infernetes.operator.claims import ClaimCheck
from infernetes.operator.discovery import ServedApis
from infernetes.operator.drift import differences, scaled_by_others, stale_fields, with_hash
from infernetes.operator.engine_support import review_engine
from infernetes.operator.events import EventRecorder
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.gpus import TOO_LARGE, GpuLedger, too_large_for_any_node
from infernetes.operator.kube import MERGE_PATCH, KubeError, request
from infernetes.operator.multinode import LWS_MISSING
from infernetes.operator.render import SERVER, Plan, plan
from infernetes.operator.render.dra import uses_dra
from infernetes.operator.render.model_cache import held_workloads
from infernetes.operator.render.workload import gpu_resource
from infernetes.operator.status import condition_of
from infernetes.operator.status_writer import Outcome, StatusWriter
from infernetes.operator.workqueue import WorkQueue

log = logging.getLogger("infernetes.operator")

# Passes at once. A pass mostly waits on the API server, and a burst of creates must not queue
# one resource's Deployment behind another's Service (creating Services is the API server's
# slowest write here: a cluster IP each, and endpoint slices made for it), so there are many.
WORKERS = 256
STATUS_WORKERS = 4
API_THREADS = 64
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0
# Child events are gathered this long before a pass (a rollout makes many).
CHILD_DELAY_SECONDS = 0.2
# A pass's status is written this long after it, off the path that creates children, once for
# the passes of a burst.
STATUS_DELAY_SECONDS = 0.5
# A service not Ready yet is reconciled again this often, and a pass with nothing to apply reads
# its workloads back (a GET each): kopf may never deliver their events (its scan of a CRD
# installed after the operator started can run just before API discovery serves it, and no later
# event makes it scan again), and only a pass that writes gets their status in the response. A
# service on a LeaderWorkerSet (an optional CRD, the one kind that can arrive late) is rechecked
# so even when Ready, so an edit no event told of is still repaired.
UNREADY_RECHECK_SECONDS = 30.0
LATE_KINDS = frozenset({"LeaderWorkerSet"})
# At start-up, the first listing of the resources waits this long for the children's listings.
STARTUP_DELAY_SECONDS = 1.0
LEGACY_FINALIZER = f"{names.GROUP}/finalizer"
# An optional kind discovery lists may answer 404 for a second or so while a CRD comes or goes
# (see `_failed`): this many quiet retries (1 + 2 + 4 s) before it is an error.
UNANSWERED_API_RETRIES = 3


def _late_kind(result: Plan | None) -> bool:
    """Whether a workload of the pass is of a kind kopf may not watch (see LATE_KINDS)."""
    return result is not None and any(cid[1] in LATE_KINDS for cid in result.roles.values())


def ready(resource: Mapping[str, Any]) -> bool:
    """Whether the resource's status, as last written, says Ready."""
    conditions = (resource.get("status") or {}).get("conditions")
    return condition_of(conditions, "Ready").get("status") == "True"


@dataclass(frozen=True)
class Retry:
    generation: int
    at: float  # loop time
    delay: float
    error: tuple[str, str]


class Reconciler:
    def __init__(
        self, api: Any, *, default_image: str | None, otlp_traces_endpoint: str | None = None
    ) -> None:
        self.api = api
        self.default_image = default_image
        self.otlp_traces_endpoint = otlp_traces_endpoint
        self.resources = Newest()
        self.children = Children()
        self.gpus = GpuLedger()
        self.failures: dict[Key, int] = {}
        self.retries: dict[Key, Retry] = {}
        self.queue = WorkQueue()
        self.status_queue = WorkQueue()
        self.outcomes: dict[Key, Outcome] = {}
        self.pool = ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api")
        self.served = ServedApis(api, self.call, on_change=self._requeue_all)
        self.applier = Applier(api, self.call)
        self.claims = ClaimCheck(api, self.call)
        self.recorder = EventRecorder(api, self.call)
        self.status_writer = StatusWriter(
            api,
            self.call,
            resources=self.resources,
            children=self.children,
            queue=self.status_queue,
            recorder=self.recorder,
        )
        self.tasks: list[asyncio.Task] = []

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self.served.start()
        self.tasks = [
            *(asyncio.create_task(self._work(self.queue, self.reconcile)) for _ in range(WORKERS)),
            *(
                asyncio.create_task(self._work(self.status_queue, self.refresh_status))
                for _ in range(STATUS_WORKERS)
            ),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, self.served.stop(), return_exceptions=True)
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

    def forget(self, key: Key) -> None:
        self.children.forget(key)
        self.gpus.reserved.pop(key, None)
        self.failures.pop(key, None)
        self.retries.pop(key, None)
        self.queue.forget(key)
        self.status_queue.forget(key)
        self.outcomes.pop(key, None)
        self.status_writer.forget(key)

    def _requeue_all(self) -> None:
        for key in self.resources:
            self.queue.add(key)

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
            "apis": self.served.apis,
            "spare_gpus": spare,
            "gpus_per_node": self.gpus.largest(),
            "otlp_traces_endpoint": self.otlp_traces_endpoint,
        }
        if self.default_image:
            kwargs["default_image"] = self.default_image
        return ClusterFacts(**kwargs)

    async def desired(self, key: Key, resource: Mapping[str, Any]) -> Plan:
        """The render, with the server's Deployment's rollout strategy decided only when its pod
        template changes (then under the headroom lock, reserving a surge pod's GPUs)."""
        namespace, name = key
        spec, uid = resource.get("spec") or {}, resource["metadata"]["uid"]
        result = plan(spec, self.facts(self.gpus.spare()), name=name, namespace=namespace, uid=uid)
        workload = result.workloads.get(SERVER)
        live = self.children.of(key).get(child_id(workload)) if workload else None
        # A LeaderWorkerSet rolls out by its own strategy (render.leaderworkerset.rollout).
        if workload is not None and live is not None and workload["kind"] == "Deployment":
            if not differences(workload["spec"]["template"], live["spec"]["template"]):
                # No rollout is coming: keep the strategy decided when the last one started.
                workload["spec"]["strategy"] = live["spec"].get("strategy")
            elif result.gpus_per_replica and not uses_dra(spec):
                # (GPUs claimed by DRA are not in the nodes' device-plugin headroom.)
                async with self.gpus.lock:
                    spare = self.gpus.spare(excluding=key)
                    result = plan(spec, self.facts(spare), name=name, namespace=namespace, uid=uid)
                    workload = result.workloads[SERVER]
                    self.gpus.reserve(key, workload, gpu_resource(spec), result.gpus_per_replica)
        if workload is not None and live is not None and scaled_by_others(live):
            # An HPA (or KEDA, or `kubectl scale`) owns replicas through the scale subresource.
            workload["spec"].pop("replicas", None)
        self._hold_for_download(key, result)
        result.manifests = [with_hash(manifest) for manifest in result.manifests]
        return result

    def _hold_for_download(self, key: Key, result: Plan) -> None:
        """Hold the workloads until the model-cache Job for this model has succeeded."""
        held, verdict = held_workloads(
            result.manifests, result.roles.values(), self.children.of(key), result.model_name
        )
        if verdict is not None:
            result.conditions["ModelCached"] = verdict
        result.held |= held

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
        if (
            result is not None
            and not uses_dra(spec)
            and (
                why := too_large_for_any_node(
                    self.gpus.nodes, gpu_resource(spec), result.gpus_per_pod
                )
            )
        ):
            # Rather than a pod that stays Pending: nothing is applied until a node fits.
            result, error = None, (TOO_LARGE, why)
            metrics.RECONCILES.labels("invalid").inc()
        notes = Outcome(
            None,
            None,
            result.ignored if result else review_engine(spec).ignored,
            await self.claims.unshared(key, spec) if result else [],
        )
        applied = False
        if result is not None:
            applied, error = await self._converge(key, resource, result, notes)
        self.gpus.release(key, self.children.of(key).get(("apps/v1", "Deployment", key[1])))
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
        """Write the status the last pass and the children's current state call for; while the
        service is not Ready, pass again later (see UNREADY_RECHECK_SECONDS)."""
        resource, outcome = self.resources.get(key), self.outcomes.get(key)
        if resource is None or outcome is None or resource["metadata"].get("deletionTimestamp"):
            return
        await self.status_writer.write(key, resource, outcome)
        written = self.resources.get(key) or resource
        if not ready(written) or _late_kind(outcome.applied):
            self.queue.add(key, UNREADY_RECHECK_SECONDS)

    async def _converge(
        self, key: Key, resource: Mapping[str, Any], result: Plan, notes: Outcome
    ) -> tuple[bool, tuple[str, str] | None]:
        """Apply what differs and prune what is no longer rendered: (applied, error); `notes`
        are for the status written before a repair."""
        generation = resource["metadata"].get("generation", 0)
        work, extra = self._changes(key, resource, result)
        if not work and not extra:
            if not ready(resource) or _late_kind(result):
                await self._read_back(key, resource, result)
            self._settled(key, "unchanged")
            return True, None
        retry = self.retries.get(key)
        loop = asyncio.get_running_loop()
        if retry is not None and retry.generation == generation and loop.time() < retry.at:
            return False, retry.error  # backing off: the queue holds the retry
        await self._report_drift(key, resource, work, notes)
        target: Mapping[str, Any] = {}
        try:
            for target, why in work:
                edited = why[0].startswith(".")
                # The workloads go first, never waiting.
                workload = child_id(target) in result.roles.values()
                response = await self.applier.apply(target, edited=edited, workload=workload)
                self.children.observe(response)
            for target in extra:
                await self.applier.delete(target)
                self.children.observe(target, deleted=True)
        except KubeError as exc:
            return await self._failed(key, generation, target, exc)
        self._settled(key, "applied")
        log.info("reconciled %s/%s generation %s", *key, generation)
        return True, None

    async def _read_back(self, key: Key, resource: Mapping[str, Any], result: Plan) -> None:
        """Read the workloads back from the API server (see UNREADY_RECHECK_SECONDS); one gone
        or edited meanwhile is the next pass's to repair."""
        live = self.children.of(key)
        for cid in result.roles.values():
            if (cached := live.get(cid)) is None:
                continue  # held for the model download (a pass with work never reads back)
            try:
                current = await self.applier.read(cached)
            except KubeError as exc:
                # The next recheck reads again; this pass's outcome does not depend on it.
                log.warning("%s/%s: reading %s %s back: %s", *key, cid[1], cid[2], exc.message)
                return
            if current is None:
                self.children.observe(cached, deleted=True)
            else:
                self.children.observe(current)
        work, extra = self._changes(key, resource, result)
        if work or extra:
            self.queue.add(key)

    def _changes(
        self, key: Key, resource: Mapping[str, Any], result: Plan
    ) -> tuple[list[tuple[dict[str, Any], list[str]]], list[dict[str, Any]]]:
        """The rendered children that differ from their live copies (with why), and the live
        children no longer rendered; held children are neither."""
        live = self.children.of(key)
        work = [
            (m, why)
            for m in result.manifests
            if child_id(m) not in result.held and (why := stale_fields(m, live.get(child_id(m))))
        ]
        for cid, obj in list(live.items()):
            if self.served.unserved(obj):
                # Deleted with its CRD; the watch of its kind has ended without saying so.
                self.children.drop(obj)
                del live[cid]
        extra = unrendered(
            live, [child_id(m) for m in result.manifests], resource["metadata"]["uid"]
        )
        return work, extra

    async def _report_drift(
        self,
        key: Key,
        resource: Mapping[str, Any],
        work: list[tuple[dict[str, Any], list[str]]],
        notes: Outcome,
    ) -> None:
        """Before repairing a child someone deleted or edited (not a new render, not a child
        appearing because an optional API did), say so in the status of an observed generation."""
        generation = resource["metadata"].get("generation", 0)
        observed = (resource.get("status") or {}).get("observedGeneration")
        deleted = self.children.deleted(key)
        drifted = [
            f"{m['kind']} {m['metadata']['name']}: " + ", ".join(why[:3])
            for m, why in work
            if why != ["render changed"] and (why != ["missing"] or child_id(m) in deleted)
        ]
        if drifted and observed == generation:
            log.info("%s/%s: repairing %s", *key, "; ".join(drifted))
            await self.status_writer.write(key, resource, notes, stale=drifted)

    async def _failed(
        self, key: Key, generation: int, target: Mapping[str, Any], exc: KubeError
    ) -> tuple[bool, tuple[str, str] | None]:
        """A child the API server refused: render again when its API went away, else retry with
        backoff, with the error for the status."""
        if await self.served.gone(target):
            # Its objects go with its CRD (no watch event will say so): render again.
            self.children.drop(target)
            self.queue.add(key)
            return False, None
        what = f"{target['kind']} {target['metadata']['name']}"
        if (
            exc.status == 404
            and self.served.optional(target)
            and self.failures.get(key, 0) < UNANSWERED_API_RETRIES
        ):
            # Discovery lists the kind, yet its endpoint answered 404: the API server's handler
            # of a CRD and its discovery follow the CRD's arrival or removal separately. Not an
            # error unless it lasts.
            delay = self._backoff(key)
            self.queue.add(key, delay)
            log.info("%s/%s: %s: its API is not answering yet (retry in %.0fs)", *key, what, delay)
            return False, None
        delay = self._backoff(key)
        # The message stays the same from one attempt to the next: one status write, one event.
        error = ("ReconcileError", f"applying {what}: {exc.message}")
        at = asyncio.get_running_loop().time() + delay
        self.retries[key] = Retry(generation, at, delay, error)
        self.queue.add(key, delay)
        metrics.RECONCILES.labels("error").inc()
        log.warning("%s/%s: %s (retry in %.0fs)", *key, error[1], delay)
        return False, error

    def _settled(self, key: Key, outcome: str) -> None:
        """Every child as rendered: no backoff left."""
        self.failures.pop(key, None)
        self.retries.pop(key, None)
        metrics.RECONCILES.labels(outcome).inc()

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
