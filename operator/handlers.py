"""kopf handlers: thin glue between watch events and render / apply / status derivation.

- The InferenceService's create/update/resume handler renders and applies (server-side apply,
  owner references), prunes what the render no longer produces and writes the plan's status.
- Owned Deployments and pods feed in-memory indices; their events re-derive the owner's
  conditions (and re-create a child that someone deleted).
- Nodes and GPU-holding pods feed the GPU headroom that `rollout: Auto` needs.
"""

import asyncio
import contextvars
import datetime
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import kopf
from infernetes.operator import metrics, names
from infernetes.operator.apply import PRUNABLE, apply, prune
from infernetes.operator.argv import EngineSpecError
from infernetes.operator.discovery import discover_apis
from infernetes.operator.engine_support import review_engine
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.gpus import node_gpus, pod_gpus, spare_gpus
from infernetes.operator.kube import MERGE_PATCH, KubeError, make_client, request
from infernetes.operator.render import Plan, plan
from infernetes.operator.status import derive_status, same_status, transitions

ISVC = (names.GROUP, names.VERSION, names.PLURAL)
OWNED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
Key = tuple[str, str]
# NAMESPACED: kopf's callback protocols type `namespace` as `str | None`, None being for
# cluster-scoped resources; every resource whose handlers take a namespace here is namespaced, so
# they take `namespace: str`, and mypy is told so where each handler is registered.
# How long child events of one resource are gathered before its status is re-derived.
REFRESH_DELAY_SECONDS = 0.3


def plain(value: Any) -> Any:
    """A deep copy made of dicts and lists (kopf hands out read-only views)."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def first(store: Any) -> Any:
    for value in store or ():
        return value
    return None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reference(name: str, namespace: str, uid: str) -> kopf.Body:
    """What kopf needs to post an event about an object it is not handling right now."""
    return kopf.Body(
        {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
        }
    )


# --- start-up ---------------------------------------------------------------------------------


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    options = memo.options
    memo.loop = asyncio.get_running_loop()
    # Handler progress and the last-handled spec live in annotations: the CRD's structural
    # schema would prune kopf's default status fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{names.GROUP}/finalizer"
    # kopf's own log lines become events only when they matter; ours are posted explicitly.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 16
    settings.watching.server_timeout = 300
    memo.api = await memo.loop.run_in_executor(None, make_client)
    memo.apis = await memo.loop.run_in_executor(None, discover_apis, memo.api)
    memo.status_locks = defaultdict(threading.Lock)
    memo.status_locks_guard = threading.Lock()
    memo.last_status = {}
    memo.pending_refresh = set()
    memo.refresh_tasks = set()
    logger.info("optional APIs served: %s", ", ".join(sorted(memo.apis)) or "none")
    if options.metrics_port:
        metrics.serve_metrics(options.metrics_port, options.bind_address)


@kopf.on.cleanup()
def close(memo: kopf.Memo, **_: Any) -> None:
    memo.api.close()


@kopf.on.probe(id="optionalApis")
def optional_apis(memo: kopf.Memo, **_: Any) -> list[str]:
    return sorted(memo.apis)


# --- indices ----------------------------------------------------------------------------------


@kopf.index(*ISVC)  # type: ignore[arg-type]  # namespace: see NAMESPACED
def inference_services(
    namespace: str, name: str, uid: str, meta: Mapping, spec: Mapping, status: Mapping, **_: Any
) -> dict[Key, dict]:
    return {
        (namespace, name): {
            "uid": uid,
            "generation": meta.get("generation", 0),
            "deleting": bool(meta.get("deletionTimestamp")),
            "spec": plain(spec),
            "status": plain(status),
        }
    }


@kopf.index("apps", "v1", "deployments", labels=OWNED)  # type: ignore[arg-type]  # namespace: see NAMESPACED
def owned_deployments(
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    meta: Mapping,
    spec: Mapping,
    status: Mapping,
    **_: Any,
) -> dict:
    return {
        (namespace, labels.get(names.LABEL_INSTANCE)): {
            "metadata": {"name": name, "generation": meta.get("generation", 0)},
            "spec": {"replicas": spec.get("replicas")},
            "status": plain(status),
        }
    }


@kopf.index("", "v1", "pods", labels=OWNED)  # type: ignore[arg-type]  # namespace: see NAMESPACED
def owned_pods(
    namespace: str, name: str, labels: Mapping, meta: Mapping, status: Mapping, **_: Any
) -> dict:
    return {
        (namespace, labels.get(names.LABEL_INSTANCE)): {
            "metadata": {"name": name, "deletionTimestamp": meta.get("deletionTimestamp")},
            "status": {
                "conditions": plain(status.get("conditions")),
                "containerStatuses": plain(status.get("containerStatuses")),
            },
        }
    }


def _holds_gpus(spec: Mapping, status: Mapping, **_: Any) -> bool:
    return (
        bool(spec.get("nodeName"))
        and status.get("phase") not in ("Succeeded", "Failed")
        and bool(pod_gpus(spec))
    )


@kopf.index("", "v1", "pods", when=_holds_gpus)
def gpu_pods(spec: Mapping, **_: Any) -> dict:
    return {spec["nodeName"]: pod_gpus(spec)}


def _schedulable_gpu_node(spec: Mapping, status: Mapping, **_: Any) -> bool:
    return not spec.get("unschedulable") and bool(node_gpus(status.get("allocatable") or {}))


@kopf.index("", "v1", "nodes", when=_schedulable_gpu_node)
def gpu_nodes(name: str, status: Mapping, **_: Any) -> dict:
    return {name: node_gpus(status.get("allocatable") or {})}


# --- reconcile --------------------------------------------------------------------------------


def cluster_facts(memo: kopf.Memo, gpu_nodes: Any, gpu_pods: Any) -> ClusterFacts:
    nodes = {node: first(store) for node, store in gpu_nodes.items()}
    used = {node: list(store) for node, store in gpu_pods.items()}
    kwargs: dict[str, Any] = {"apis": memo.apis, "spare_gpus": spare_gpus(nodes, used)}
    if memo.options.image:
        kwargs["default_image"] = memo.options.image
    return ClusterFacts(**kwargs)


def apply_plan(
    memo: kopf.Memo, result: Plan, *, name: str, namespace: str, uid: str, prune_stale: bool = True
) -> None:
    for manifest in result.manifests:
        apply(memo.api, manifest)
    if not prune_stale:
        return
    served = [kind for kind in PRUNABLE if f"{kind[0]}/{kind[1]}" in memo.apis]
    prune(
        memo.api,
        name=name,
        namespace=namespace,
        owner_uid=uid,
        keep=result.manifests,
        served=served,
    )


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)  # type: ignore[arg-type]  # namespace: see NAMESPACED
def reconcile(
    body: kopf.Body,
    spec: Mapping,
    meta: Mapping,
    status: Mapping,
    name: str,
    namespace: str,
    uid: str,
    patch: kopf.Patch,
    reason: str,
    memo: kopf.Memo,
    gpu_nodes: Any,
    gpu_pods: Any,
    inference_services: Any,
    owned_deployments: Any,
    owned_pods: Any,
    **_: Any,
) -> None:
    started = time.monotonic()
    try:
        result = plan(
            plain(spec),
            cluster_facts(memo, gpu_nodes, gpu_pods),
            name=name,
            namespace=namespace,
            uid=uid,
        )
    except (EngineSpecError, KeyError, TypeError, ValueError) as exc:
        metrics.RECONCILES.labels("invalid").inc()
        kopf.warn(body, reason="InvalidSpec", message=str(exc))
        raise kopf.PermanentError(f"cannot render: {exc}") from exc
    try:
        # A resource being created has no children of an older render to prune.
        apply_plan(
            memo, result, name=name, namespace=namespace, uid=uid, prune_stale=reason != "create"
        )
    except KubeError as exc:
        metrics.RECONCILES.labels("error").inc()
        kopf.warn(body, reason="ApplyFailed", message=str(exc))
        retry_soon = exc.status in (0, 409, 429) or exc.status >= 500
        raise kopf.TemporaryError(f"apply failed: {exc}", delay=5 if retry_soon else 30) from exc
    # One event per warning: status.warnings remembers those already told.
    for warning in result.warnings:
        if warning not in (status.get("warnings") or ()):
            reason = "SettingIgnored" if warning in result.ignored else "Adjusted"
            kopf.event(body, type="Warning", reason=reason, message=warning)
    patch.status.update(
        {
            "observedGeneration": meta.get("generation", 0),
            "url": result.url,
            "modelName": result.model_name,
            "gpusPerReplica": result.gpus_per_replica,
            "serviceName": result.service_name,
            "selector": result.selector,
            "warnings": result.warnings or None,
        }
    )
    # Conditions are written by one path only (refresh_status), so a slow reconcile can never
    # overwrite what a newer child event derived; the refresh joins those the children's events
    # of this apply are about to schedule.
    memo.loop.call_soon_threadsafe(
        schedule_refresh,
        memo,
        (namespace, name),
        inference_services,
        owned_deployments,
        owned_pods,
        context=contextvars.copy_context(),
    )
    metrics.RECONCILES.labels("applied").inc()
    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


# --- children ---------------------------------------------------------------------------------


def refresh_status(memo: kopf.Memo, key: Key, isvcs: Any, deployments: Any, pods: Any) -> None:
    """Re-derive the owner's conditions from its children; write only when something changed."""
    metrics.MANAGED.set(len(isvcs))
    owner = first(isvcs.get(key))
    if owner is None or owner["deleting"]:
        return
    with memo.status_locks_guard:
        lock = memo.status_locks[key]
    with lock:
        current = owner["status"] or {}
        derived = derive_status(
            generation=owner["generation"],
            desired_replicas=owner["spec"].get("replicas", 1),
            deployment=first(deployments.get(key)),
            pods=list(pods.get(key, ())),
            previous=memo.last_status.get(key, current).get("conditions"),
            now=now(),
            ignored_settings=review_engine(owner["spec"]).ignored,
        )
        if same_status(memo.last_status.get(key, current), derived):
            return
        namespace, name = key
        path = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}/status"
        try:
            request(memo.api, "PATCH", path, body={"status": derived}, content_type=MERGE_PATCH)
        except KubeError as exc:
            if exc.status == 404:
                return
            raise
        previous = memo.last_status.get(key, current).get("conditions")
        memo.last_status[key] = derived
        metrics.STATUS_UPDATES.inc()
    for kind, reason, message in transitions(previous, derived["conditions"]):
        kopf.event(
            reference(name, namespace, owner["uid"]), type=kind, reason=reason, message=message
        )


def owner_exists(memo: kopf.Memo, key: Key, uid: str) -> bool:
    """Ask the server: the index may not have seen the owner's deletion yet (garbage collection)."""
    namespace, name = key
    try:
        current = request(
            memo.api,
            "GET",
            f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{name}",
        )
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return current["metadata"]["uid"] == uid and not current["metadata"].get("deletionTimestamp")


def schedule_refresh(memo: kopf.Memo, key: Key, isvcs: Any, deployments: Any, pods: Any) -> None:
    """Refresh the owner's status a moment from now, once for a burst of child events.

    A rollout or a burst of creations makes many pod and Deployment events per resource; the
    indices are live, so one refresh after the burst sees them all.
    """
    if key in memo.pending_refresh:
        return
    memo.pending_refresh.add(key)
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()  # kopf's event poster lives in context variables

    async def later() -> None:
        await asyncio.sleep(REFRESH_DELAY_SECONDS)
        memo.pending_refresh.discard(key)
        await loop.run_in_executor(
            None, context.run, refresh_status, memo, key, isvcs, deployments, pods
        )

    task = loop.create_task(later())
    memo.refresh_tasks.add(task)
    task.add_done_callback(memo.refresh_tasks.discard)


def restore_deployment(
    memo: kopf.Memo, key: Key, owner: Mapping, gpu_nodes: Any, gpu_pods: Any
) -> None:
    if not owner_exists(memo, key, owner["uid"]):
        return
    namespace, name = key
    result = plan(
        owner["spec"],
        cluster_facts(memo, gpu_nodes, gpu_pods),
        name=name,
        namespace=namespace,
        uid=owner["uid"],
    )
    apply_plan(memo, result, name=name, namespace=namespace, uid=owner["uid"])


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)  # type: ignore[arg-type]  # namespace: see NAMESPACED
async def deployment_changed(
    type: str,
    namespace: str,
    labels: Mapping[str, str],
    memo: kopf.Memo,
    inference_services: Any,
    owned_deployments: Any,
    owned_pods: Any,
    gpu_nodes: Any,
    gpu_pods: Any,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    key = (namespace, labels.get(names.LABEL_INSTANCE, ""))  # "": no owner has that name
    owner = first(inference_services.get(key))
    if type == "DELETED" and owner is not None and not owner["deleting"]:
        # Someone deleted our Deployment while its owner lives: put it back (level-based).
        logger.info("Deployment of %s/%s was deleted; re-applying", *key)
        context = contextvars.copy_context()
        await asyncio.get_running_loop().run_in_executor(
            None, context.run, restore_deployment, memo, key, owner, gpu_nodes, gpu_pods
        )
    schedule_refresh(memo, key, inference_services, owned_deployments, owned_pods)


@kopf.on.event("", "v1", "pods", labels=OWNED)  # type: ignore[arg-type]  # namespace: see NAMESPACED
async def pod_changed(
    namespace: str,
    labels: Mapping[str, str],
    memo: kopf.Memo,
    inference_services: Any,
    owned_deployments: Any,
    owned_pods: Any,
    **_: Any,
) -> None:
    key = (namespace, labels.get(names.LABEL_INSTANCE, ""))  # "": no owner has that name
    schedule_refresh(memo, key, inference_services, owned_deployments, owned_pods)
