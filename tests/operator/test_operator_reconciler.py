"""The reconciler's passes against an in-memory API (the e2e tests run it against a real one):
writes only what differs, repairs drift, leaves replicas to an autoscaler, reports apply errors
with backoff and keeps observedGeneration at the last generation applied."""

import asyncio
import copy
import itertools
from typing import Any

import pytest
from infernetes.operator import apply, events, status_writer
from infernetes.operator import reconciler as module
from infernetes.operator.cache import child_id
from infernetes.operator.kube import KubeError
from infernetes.operator.reconciler import Reconciler

KEY = ("ns", "llama")


class FakeApi:
    """Objects by (apiVersion, kind, name); counts writes and reads (GETs of children);
    refuses what `refuse` says."""

    def __init__(self) -> None:
        self.objects: dict[tuple, dict] = {}
        self.versions = itertools.count(10)
        self.writes: list[str] = []
        self.reads: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.refuse: Any = None
        self.ready_when_applied: list[str | None] = []
        self.resource = {
            "apiVersion": "infernetes.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {
                "name": "llama",
                "namespace": "ns",
                "uid": "u-1",
                "generation": 1,
                "resourceVersion": "1",
            },
            "spec": {"model": "m", "gpu": {"count": 1}},
        }

    def apply(self, api: Any, manifest: dict) -> dict:
        if self.refuse and self.refuse(manifest):
            raise KubeError(422, self.refuse(manifest))
        self.writes.append(f"apply {manifest['kind']}")
        ready = [
            c for c in self.resource.get("status", {}).get("conditions", ()) if c["type"] == "Ready"
        ]
        self.ready_when_applied.append(ready[0]["reason"] if ready else None)
        live = copy.deepcopy(manifest)
        old = self.objects.get(child_id(manifest))
        if old is not None and "replicas" in old.get("spec", {}):
            live["spec"].setdefault("replicas", old["spec"]["replicas"])  # fields another owns
        live["metadata"]["managedFields"] = (old or {}).get("metadata", {}).get(
            "managedFields"
        ) or [{"manager": "infernetes", "operation": "Apply"}]
        live["metadata"]["resourceVersion"] = str(next(self.versions))
        self.objects[child_id(manifest)] = live
        return copy.deepcopy(live)

    def delete(self, api: Any, manifest: dict) -> None:
        self.writes.append(f"delete {manifest['kind']}")
        self.objects.pop(child_id(manifest), None)

    def get(self, path: str) -> dict:
        self.reads.append("get " + "/".join(path.split("/")[-2:]))  # e.g. get deployments/llama
        found = [obj for obj in self.objects.values() if apply.object_path(obj) == path]
        if not found:
            raise KubeError(404, f"{path} not found")
        return copy.deepcopy(found[0])

    def request(self, api: Any, method: str, path: str, **kwargs: Any) -> Any:
        body = kwargs.get("body")
        if method == "GET":
            return self.get(path)
        if path.endswith("/events"):
            self.events.append((body["reason"], body["message"]))
            return body
        if path.endswith("/llama"):  # the resource itself: only its finalizers
            self.writes.append("finalizers")
            self.resource = copy.deepcopy(self.resource)
            self.resource["metadata"]["finalizers"] = body["metadata"]["finalizers"]
            self.resource["metadata"]["resourceVersion"] = str(next(self.versions))
            return copy.deepcopy(self.resource)
        assert method == "PATCH" and path.endswith("/llama/status"), path
        self.writes.append("status")
        self.resource = copy.deepcopy(self.resource)
        self.resource["status"] = {
            key: value
            for key, value in {**self.resource.get("status", {}), **body["status"]}.items()
            if value is not None
        }
        self.resource["metadata"]["resourceVersion"] = str(next(self.versions))
        return copy.deepcopy(self.resource)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(apply, "apply", fake.apply)
    monkeypatch.setattr(apply, "delete", fake.delete)
    for requests in (apply, module, status_writer, events):
        monkeypatch.setattr(requests, "request", fake.request)
    return fake


def run(api: FakeApi, *steps: Any) -> Reconciler:
    """A reconciler fed with the resource, then one pass after each step."""

    async def main() -> Reconciler:
        reconciler = Reconciler(None, default_image=None)
        for step in steps:
            step(reconciler)
            reconciler.resources.observe(KEY, copy.deepcopy(api.resource))
            await reconciler.reconcile(KEY)
            await reconciler.refresh_status(KEY)
        return reconciler

    return asyncio.run(main())


def condition(api: FakeApi, kind: str) -> dict:
    return next(c for c in api.resource["status"]["conditions"] if c["type"] == kind)


def nothing(reconciler: Reconciler) -> None:
    pass


def test_create_writes_each_child_once_and_a_second_pass_writes_nothing(api: FakeApi) -> None:
    run(api, nothing, nothing, nothing)
    assert api.writes == ["apply Deployment", "apply Service", "status"]
    assert api.resource["status"]["observedGeneration"] == 1
    # Not Ready (no Deployment controller here): each unchanged pass reads the workload back,
    # and only the workload.
    assert api.reads == ["get deployments/llama"] * 2


def test_a_deleted_child_is_applied_again_and_status_tells_meanwhile(api: FakeApi) -> None:
    def delete_service(reconciler: Reconciler) -> None:
        service = api.objects.pop(("v1", "Service", "llama"))
        reconciler.child_event("DELETED", service)

    run(api, nothing, delete_service)
    assert api.writes[3:] == ["status", "apply Service", "status"]
    assert ("v1", "Service", "llama") in api.objects
    assert ("Repairing", "re-applying Service llama: missing") in api.events
    assert api.ready_when_applied[-1] == "ChildrenStale"
    assert condition(api, "Ready")["reason"] != "ChildrenStale"


def test_a_workload_deleted_without_an_event_is_recreated_after_the_recheck(
    api: FakeApi,
) -> None:
    """The recheck of a service not Ready reads its Deployment back; gone, it is observed
    deleted and the next pass (queued at once) applies it again, saying so."""
    seen: dict[str, Any] = {}

    def delete_unseen(reconciler: Reconciler) -> None:
        del api.objects[("apps/v1", "Deployment", "llama")]
        api.writes.clear()
        seen["queued before"] = len(reconciler.queue)  # the recheck's timer

    def after_the_recheck(reconciler: Reconciler) -> None:
        seen["writes"], seen["reads"] = list(api.writes), list(api.reads)
        seen["queued"] = len(reconciler.queue)
        api.writes.clear()

    run(api, nothing, delete_unseen, after_the_recheck)
    assert seen["reads"] == ["get deployments/llama"]
    assert not [write for write in seen["writes"] if write.startswith("apply")]
    assert seen["queued"] == seen["queued before"] + 1  # the repair, now
    assert "apply Deployment" in api.writes
    assert ("apps/v1", "Deployment", "llama") in api.objects
    assert ("Repairing", "re-applying Deployment llama: missing") in api.events


def test_an_edited_deployment_is_restored(api: FakeApi) -> None:
    def edit(reconciler: Reconciler) -> None:
        live = copy.deepcopy(api.objects[("apps/v1", "Deployment", "llama")])
        live["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
        live["metadata"]["resourceVersion"] = str(next(api.versions))
        api.objects[child_id(live)] = live
        reconciler.child_event("MODIFIED", live)

    run(api, nothing, edit, nothing)
    assert api.writes[3:] == ["status", "apply Deployment", "status"]
    image = api.objects[("apps/v1", "Deployment", "llama")]["spec"]["template"]["spec"]
    assert image["containers"][0]["image"] != "other:1"


def test_replicas_scaled_by_an_autoscaler_are_left_to_it(api: FakeApi) -> None:
    def autoscale(reconciler: Reconciler) -> None:
        live = copy.deepcopy(api.objects[("apps/v1", "Deployment", "llama")])
        live["spec"]["replicas"] = 4
        live["metadata"]["resourceVersion"] = str(next(api.versions))
        live["metadata"]["managedFields"].append(
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "subresource": "scale",
                "fieldsV1": {"f:spec": {"f:replicas": {}}},
            }
        )
        api.objects[child_id(live)] = live
        reconciler.child_event("MODIFIED", live)

    def change_spec(reconciler: Reconciler) -> None:
        api.resource["metadata"]["generation"] = 2
        api.resource["spec"]["engine"] = {"maxNumSeqs": 4}

    run(api, nothing, autoscale, change_spec)
    deployment = api.objects[("apps/v1", "Deployment", "llama")]
    assert deployment["spec"]["replicas"] == 4  # the apply carried no replicas
    assert "--max-num-seqs=4" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_apply_error_is_a_condition_with_backoff_and_keeps_observed_generation(
    api: FakeApi,
) -> None:
    delays: list[float] = []

    def break_spec(reconciler: Reconciler) -> None:
        api.resource["metadata"]["generation"] = 2
        api.resource["spec"]["affinity"] = {"nodeAffinity": {}}
        api.refuse = lambda m: (
            "spec.template.spec.affinity: Invalid value" if m["kind"] == "Deployment" else None
        )

    def retry_now(reconciler: Reconciler) -> None:
        retry = reconciler.retries[KEY]
        delays.append(retry.delay)
        reconciler.retries[KEY] = module.Retry(retry.generation, 0.0, retry.delay, retry.error)

    reconciler = run(api, nothing, break_spec, retry_now, retry_now, nothing)
    delays.append(reconciler.retries[KEY].delay)
    assert api.resource["status"]["observedGeneration"] == 1
    degraded = condition(api, "Degraded")
    assert degraded["reason"] == "ReconcileError"
    assert (
        "applying Deployment llama: spec.template.spec.affinity: Invalid value"
        in (degraded["message"])
    )
    assert condition(api, "Ready")["status"] == "False"
    assert condition(api, "Ready")["observedGeneration"] == 2
    # Three attempts, each followed by a longer wait; the last pass came before its retry was
    # due and did not try again.
    assert delays == [1.0, 2.0, 4.0]
    assert reconciler.failures[KEY] == 3
    # One event for the failure, although it failed three times.
    assert [reason for reason, _ in api.events].count("ReconcileError") == 1


def test_a_spec_that_cannot_render_is_reported(api: FakeApi) -> None:
    def break_spec(reconciler: Reconciler) -> None:
        api.resource["metadata"]["generation"] = 2
        api.resource["spec"]["engine"] = {"noSuchField": 1}

    run(api, nothing, break_spec)
    assert condition(api, "Degraded")["reason"] == "InvalidSpec"
    assert api.resource["status"]["observedGeneration"] == 1


def test_the_finalizer_of_earlier_releases_is_removed_once(api: FakeApi) -> None:
    api.resource["metadata"]["finalizers"] = ["infernetes.io/finalizer", "other.io/keep"]
    run(api, nothing, nothing)
    assert api.resource["metadata"]["finalizers"] == ["other.io/keep"]
    assert api.writes.count("finalizers") == 1


def test_a_replica_larger_than_any_node_is_reported_not_rendered(api: FakeApi) -> None:
    """A pod of 16 GPUs (spec.gpu.perNode 16) on 8-GPU nodes is a condition, not a Deployment
    that stays Pending; a node that fits brings it in."""
    api.resource["spec"] = {
        "model": "m",
        "gpu": {"perNode": 16},
        "engine": {"tensorParallelSize": 16},
    }
    eight = {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}

    def eight_gpu_nodes(reconciler: Reconciler) -> None:
        for name in ("a", "b"):
            reconciler.node_event("ADDED", {"metadata": {"name": name}, **eight})

    seen: dict[str, Any] = {}

    def check_and_add_a_larger_node(reconciler: Reconciler) -> None:
        seen["degraded"] = condition(api, "Degraded")
        seen["writes"] = list(api.writes)
        sixteen = {"status": {"allocatable": {"nvidia.com/gpu": "16"}}}
        reconciler.node_event("ADDED", {"metadata": {"name": "c"}, **sixteen})
        seen["queued"] = len(reconciler.queue)

    run(api, eight_gpu_nodes, check_and_add_a_larger_node)
    degraded = seen["degraded"]
    assert degraded["reason"] == "TooLargeForAnyNode"
    assert "needs 16 nvidia.com/gpu" in degraded["message"]
    assert "largest node has 8" in degraded["message"]
    assert not any(write.startswith("apply") for write in seen["writes"])
    assert seen["queued"] == 1  # the new node brings it back
    assert "apply Deployment" in api.writes
    assert condition(api, "Degraded")["status"] == "False"


def test_no_known_gpu_node_is_no_reason_to_hold_back(api: FakeApi) -> None:
    api.resource["spec"] = {"model": "m", "engine": {"tensorParallelSize": 16}}
    run(api, nothing)
    assert "apply Deployment" in api.writes


def test_the_autoscaler_follows_the_served_apis_and_goes_with_spec_autoscaling(
    api: FakeApi,
) -> None:
    """An HPA without KEDA; a ScaledObject in its place once KEDA's API is served; nothing once
    spec.autoscaling is removed. The Autoscaling condition says which, then goes."""
    api.resource["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "targetQueuedRequests": 2,
        "keda": {"prometheusServerAddress": "http://prometheus:9090"},
    }
    seen: dict[str, Any] = {}

    def keda_appears(reconciler: Reconciler) -> None:
        seen["first"] = (list(api.writes), condition(api, "Autoscaling")["reason"])
        api.writes.clear()
        reconciler.served.discovered = frozenset({"keda.sh/v1alpha1/ScaledObject"})

    def autoscaling_removed(reconciler: Reconciler) -> None:
        seen["keda"] = (list(api.writes), condition(api, "Autoscaling")["reason"])
        api.writes.clear()
        api.resource["metadata"]["generation"] = 2
        del api.resource["spec"]["autoscaling"]

    run(api, nothing, keda_appears, autoscaling_removed)
    assert seen["first"] == (
        ["apply Deployment", "apply Service", "apply HorizontalPodAutoscaler", "status"],
        "HorizontalPodAutoscaler",
    )
    assert seen["keda"] == (
        ["apply ScaledObject", "delete HorizontalPodAutoscaler", "status"],
        "ScaledObject",
    )
    assert api.writes == ["delete ScaledObject", "status"]  # the pods never notice
    assert "Autoscaling" not in [c["type"] for c in api.resource["status"]["conditions"]]
    assert ("keda.sh/v1alpha1", "ScaledObject", "llama") not in api.objects


# --- a replica across nodes (LeaderWorkerSet) ------------------------------------------------

LWS = "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"


def eight_gpu_nodes(reconciler: Reconciler) -> None:
    for name in ("a", "b"):
        node = {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
        reconciler.node_event("ADDED", node)


def test_tp16_on_8_gpu_nodes_waits_for_the_lws_api_then_becomes_a_leaderworkerset(
    api: FakeApi,
) -> None:
    """GPUs per node discovered from the nodes: without the LeaderWorkerSet API nothing is
    applied (a condition and an event say why); once discovery finds it, the LeaderWorkerSet
    and the Service come, and a further pass writes nothing."""
    api.resource["spec"] = {"model": "m", "engine": {"tensorParallelSize": 16}}
    seen: dict[str, Any] = {}

    def lws_appears(reconciler: Reconciler) -> None:
        seen["ready"] = condition(api, "Ready")
        seen["writes"] = list(api.writes)
        api.writes.clear()
        reconciler.served.discovered = frozenset({LWS})

    def again(reconciler: Reconciler) -> None:
        seen["applied"] = list(api.writes)
        api.writes.clear()

    run(api, eight_gpu_nodes, lws_appears, again)
    assert seen["ready"]["status"] == "False"
    assert seen["ready"]["reason"] == "LeaderWorkerSetMissing"
    assert "spans 2 nodes" in seen["ready"]["message"]
    assert not any(write.startswith("apply") for write in seen["writes"])
    assert ("LeaderWorkerSetMissing", seen["ready"]["message"]) in api.events
    assert seen["applied"][:2] == ["apply LeaderWorkerSet", "apply Service"]
    assert api.writes == []
    lws = api.objects[("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llama")]
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    service = api.objects[("v1", "Service", "llama")]
    assert service["spec"]["selector"]["infernetes.io/role"] == "leader"
    assert api.resource["status"]["gpusPerReplica"] == 16


def test_switching_between_deployment_and_leaderworkerset_removes_the_other(
    api: FakeApi,
) -> None:
    api.resource["spec"] = {
        "model": "m",
        "gpu": {"perNode": 8},
        "engine": {"tensorParallelSize": 8},
    }
    seen: dict[str, Any] = {}

    def to_tp16(reconciler: Reconciler) -> None:
        seen["first"] = list(api.writes)
        api.writes.clear()
        reconciler.served.discovered = frozenset({LWS})
        api.resource["metadata"]["generation"] = 2
        api.resource["spec"]["engine"]["tensorParallelSize"] = 16

    def back_to_tp8(reconciler: Reconciler) -> None:
        seen["second"] = list(api.writes)
        api.writes.clear()
        api.resource["metadata"]["generation"] = 3
        api.resource["spec"]["engine"]["tensorParallelSize"] = 8

    run(api, nothing, to_tp16, back_to_tp8)
    assert seen["first"][0] == "apply Deployment"
    assert "apply LeaderWorkerSet" in seen["second"]
    assert "delete Deployment" in seen["second"]
    assert "apply Deployment" in api.writes and "delete LeaderWorkerSet" in api.writes
    kinds = {kind for _, kind, _ in api.objects}
    assert "LeaderWorkerSet" not in kinds and "Deployment" in kinds


def lws_groups_ready(api: FakeApi, groups: int) -> dict[str, Any]:
    """The LeaderWorkerSet controller's view: all its `groups` ready."""
    lws_id = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llama")
    live = copy.deepcopy(api.objects[lws_id])
    live["metadata"]["generation"] = 1
    live["metadata"]["resourceVersion"] = str(next(api.versions))
    live["status"] = {
        "observedGeneration": 1,
        "replicas": groups,
        "readyReplicas": groups,
        "updatedReplicas": groups,
        "conditions": [{"type": "Available", "status": "True", "reason": "AllGroupsReady"}],
    }
    api.objects[lws_id] = live
    return live


def test_a_leaderworkerset_whose_kind_kopf_never_watched_is_read_back_until_ready(
    api: FakeApi,
) -> None:
    """The e2e's race: the LeaderWorkerSet API appears after the operator started and kopf
    never watches its kind, so no event tells that its groups became ready. The recheck pass
    (nothing to apply, not Ready) reads it back with a GET and the service becomes Ready."""
    api.resource["spec"] = {"model": "m", "engine": {"tensorParallelSize": 16}}
    seen: dict[str, Any] = {}

    def lws_appears(reconciler: Reconciler) -> None:
        reconciler.served.discovered = frozenset({LWS})

    def groups_ready_untold(reconciler: Reconciler) -> None:
        seen["ready"] = condition(api, "Ready")["status"]
        seen["reads"] = list(api.reads)
        lws_groups_ready(api, 1)
        api.writes.clear()

    run(api, eight_gpu_nodes, lws_appears, groups_ready_untold)
    assert seen["ready"] == "False"
    assert seen["reads"] == []
    assert api.reads == ["get leaderworkersets/llama"]
    assert api.writes == ["status"]
    assert condition(api, "Ready")["status"] == "True"
    assert api.resource["status"]["readyReplicas"] == 1


def test_a_ready_leaderworkerset_edited_without_an_event_is_repaired_on_the_recheck(
    api: FakeApi,
) -> None:
    """kopf never watches a kind whose CRD came after the operator started, so a service on a
    LeaderWorkerSet is rechecked even when Ready: the pass reads it back, sees an edit no event
    told of, and the next pass puts the operator's template back."""
    api.resource["spec"] = {"model": "m", "engine": {"tensorParallelSize": 16}}
    lws_id = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llama")
    seen: dict[str, Any] = {}

    def lws_appears(reconciler: Reconciler) -> None:
        reconciler.served.discovered = frozenset({LWS})

    def groups_ready_untold(reconciler: Reconciler) -> None:
        lws_groups_ready(api, 1)

    def edited_untold(reconciler: Reconciler) -> None:
        seen["ready"] = condition(api, "Ready")["status"]
        seen["queued"] = len(reconciler.queue)  # the recheck, though Ready
        live = copy.deepcopy(api.objects[lws_id])
        template = live["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        template["spec"]["containers"][0]["image"] = "someone/else:1"
        live["metadata"]["resourceVersion"] = str(next(api.versions))
        api.objects[lws_id] = live
        api.writes.clear()

    run(api, eight_gpu_nodes, lws_appears, groups_ready_untold, edited_untold, nothing)
    assert seen["ready"] == "True" and seen["queued"] >= 1
    assert "apply LeaderWorkerSet" in api.writes
    template = api.objects[lws_id]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert template["spec"]["containers"][0]["image"] != "someone/else:1"


def test_status_reads_the_leaderworkerset_and_drift_is_repaired(api: FakeApi) -> None:
    api.resource["spec"] = {
        "model": "m",
        "replicas": 2,
        "gpu": {"perNode": 8},
        "engine": {"tensorParallelSize": 16},
    }
    lws_id = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llama")
    seen: dict[str, Any] = {}

    def served(reconciler: Reconciler) -> None:
        reconciler.served.discovered = frozenset({LWS})

    def groups_ready(reconciler: Reconciler) -> None:
        seen["before"] = condition(api, "Ready")
        reconciler.child_event("MODIFIED", copy.deepcopy(lws_groups_ready(api, 2)))

    def image_edited(reconciler: Reconciler) -> None:
        seen["ready"] = condition(api, "Ready")
        seen["replicas"] = api.resource["status"]["readyReplicas"]
        api.writes.clear()
        live = copy.deepcopy(api.objects[lws_id])
        template = live["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        template["spec"]["containers"][0]["image"] = "someone/else:1"
        live["metadata"]["resourceVersion"] = str(next(api.versions))
        api.objects[lws_id] = live
        reconciler.child_event("MODIFIED", copy.deepcopy(live))

    run(api, served, nothing, groups_ready, image_edited)
    assert seen["before"]["status"] == "False"
    assert seen["ready"]["status"] == "True", seen["ready"]
    assert seen["replicas"] == 2
    assert "apply LeaderWorkerSet" in api.writes
    template = api.objects[lws_id]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert template["spec"]["containers"][0]["image"] != "someone/else:1"


# --- routing (InferencePool) -----------------------------------------------------------------


def test_the_pool_follows_the_served_api_and_goes_with_spec_routing(api: FakeApi) -> None:
    """Without the extension's API: no pool and a False Routing condition; the pool and its
    picker once it is served; all of it deleted once spec.routing is removed."""
    api.resource["spec"]["routing"] = {}
    seen: dict[str, Any] = {}

    def extension_appears(reconciler: Reconciler) -> None:
        seen["first"] = (list(api.writes), condition(api, "Routing")["reason"])
        api.writes.clear()
        reconciler.served.discovered = frozenset({"inference.networking.k8s.io/v1/InferencePool"})

    def routing_removed(reconciler: Reconciler) -> None:
        seen["served"] = (sorted(api.writes), condition(api, "Routing")["reason"])
        api.writes.clear()
        api.resource["metadata"]["generation"] = 2
        del api.resource["spec"]["routing"]

    run(api, nothing, extension_appears, routing_removed)
    assert seen["first"] == (
        ["apply Deployment", "apply Service", "status"],
        "InferencePoolMissing",
    )
    picker = ["Deployment", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"]
    assert seen["served"] == (
        sorted([f"apply {kind}" for kind in picker] + ["status"]),
        "InferencePool",
    )
    assert sorted(api.writes) == sorted([f"delete {kind}" for kind in picker] + ["status"])
    assert "Routing" not in [c["type"] for c in api.resource["status"]["conditions"]]
    assert set(api.objects) == {
        ("apps/v1", "Deployment", "llama"),
        ("v1", "Service", "llama"),
    }


# --- model cache (download Job) --------------------------------------------------------------


def test_the_deployment_waits_for_the_download_job_and_a_new_model_keeps_the_old_one(
    api: FakeApi,
) -> None:
    api.resource["spec"]["modelCache"] = {"claimName": "cache", "download": True}
    seen: dict[str, Any] = {}

    def job_completes(reconciler: Reconciler) -> None:
        seen["first"] = (list(api.writes), condition(api, "ModelCached")["reason"])
        api.writes.clear()
        (job_id,) = [cid for cid in api.objects if cid[1] == "Job"]
        job = api.objects[job_id]
        job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        job["metadata"]["resourceVersion"] = "999"
        reconciler.children.observe(copy.deepcopy(job))

    def model_changes(reconciler: Reconciler) -> None:
        seen["done"] = (list(api.writes), condition(api, "ModelCached")["reason"])
        api.writes.clear()
        api.resource["metadata"]["generation"] = 2
        api.resource["spec"]["model"] = "other"

    run(api, nothing, job_completes, model_changes)
    assert seen["first"] == (["apply Service", "apply Job", "status"], "Downloading")
    assert seen["done"] == (["apply Deployment", "status"], "Downloaded")
    # The new model's Job runs; the old Job goes; the Deployment serving the old model stays.
    assert sorted(api.writes) == ["apply Job", "delete Job", "status"]
    assert condition(api, "ModelCached")["reason"] == "Downloading"
    assert ("apps/v1", "Deployment", "llama") in api.objects


def deployment_status(api: FakeApi, reconciler: Reconciler, ready: int, told: bool = True) -> None:
    """The Deployment controller's view: its one replica created, `ready` of it ready; the
    watch event delivered unless not `told`."""
    live = copy.deepcopy(api.objects[("apps/v1", "Deployment", "llama")])
    live["metadata"]["generation"] = 1
    live["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            {"type": "Available", "status": "True" if ready else "False", "reason": "R"}
        ],
    }
    live["metadata"]["resourceVersion"] = str(next(api.versions))
    api.objects[child_id(live)] = live
    if told:
        reconciler.child_event("MODIFIED", copy.deepcopy(live))


def test_a_deployment_ready_without_an_event_is_read_back_on_the_recheck(api: FakeApi) -> None:
    """The Deployment became ready and no watch event said so: the recheck pass of the service
    not Ready reads it back (writing nothing but the status) and the service becomes Ready;
    once Ready, a pass reads nothing."""
    seen: dict[str, Any] = {}

    def ready_untold(reconciler: Reconciler) -> None:
        seen["reads"] = list(api.reads)
        deployment_status(api, reconciler, ready=1, told=False)
        api.writes.clear()

    def after_the_recheck(reconciler: Reconciler) -> None:
        seen["ready"] = condition(api, "Ready")["status"]

    run(api, nothing, ready_untold, after_the_recheck)
    assert seen["reads"] == []  # the first pass applied: its responses were read
    assert seen["ready"] == "True"
    assert api.writes == ["status"]
    assert api.reads == ["get deployments/llama"]


def scheduled_pod(reconciler: Reconciler) -> None:
    labels = {"app.kubernetes.io/instance": "llama", "app.kubernetes.io/managed-by": "infernetes"}
    pod = {
        "metadata": {"name": "llama-1", "namespace": "ns", "labels": labels},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    reconciler.pod_event("ADDED", pod)


def pod_scheduled(api: FakeApi) -> Any:
    def step(reconciler: Reconciler) -> None:
        scheduled_pod(reconciler)
        deployment_status(api, reconciler, ready=0)

    return step


def test_progress_waits_to_be_written_with_the_next_change(api: FakeApi) -> None:
    reconciler = run(api, nothing, pod_scheduled(api))
    assert api.writes == ["apply Deployment", "apply Service", "status"]
    assert condition(api, "Scheduled")["status"] == "Unknown"  # held back, not yet due
    assert KEY in reconciler.status_writer.progress_seen


def test_ready_does_not_wait_and_takes_the_held_progress_along(api: FakeApi) -> None:
    def pod_ready(reconciler: Reconciler) -> None:
        deployment_status(api, reconciler, ready=1)

    reconciler = run(api, nothing, pod_scheduled(api), pod_ready)
    # A pod scheduled, then ready: one write, not two.
    assert api.writes == ["apply Deployment", "apply Service", "status", "status"]
    assert condition(api, "Ready")["status"] == "True"
    assert condition(api, "Scheduled")["status"] == "True"
    assert KEY not in reconciler.status_writer.progress_seen


def test_held_progress_is_written_once_it_has_settled(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status_writer, "PROGRESS_SETTLE_SECONDS", 0.0)
    run(api, nothing, pod_scheduled(api))
    assert api.writes == ["apply Deployment", "apply Service", "status", "status"]
    assert condition(api, "Scheduled")["status"] == "True"


def test_each_new_warning_is_an_event_once(api: FakeApi) -> None:
    """An ignored engine setting is SettingIgnored, an adjustment of the render Adjusted; a
    warning the status already holds is not told again."""
    api.resource["spec"]["engine"] = {"swapSpace": 8}
    api.resource["spec"]["monitoring"] = {"mode": "serviceMonitor"}
    run(api, nothing, nothing)
    told = [
        (reason, message.split(" ")[0])
        for reason, message in api.events
        if reason in ("Adjusted", "SettingIgnored")
    ]
    assert told == [("Adjusted", "monitoring.mode"), ("SettingIgnored", "spec.engine.swapSpace:")]


def condition_series(namespace: str, name: str) -> dict[tuple[str, str], float]:
    """The operator's per-condition series of one service, as /metrics exports them."""
    from infernetes.operator import metrics
    from prometheus_client import REGISTRY

    return {
        (sample.labels["condition"], sample.labels["status"]): sample.value
        for family in REGISTRY.collect()
        if family.name == metrics.CONDITION._name
        for sample in family.samples
        if (sample.labels["inference_service_namespace"], sample.labels["inference_service"])
        == (namespace, name)
    }


def test_condition_metric_follows_the_written_status_and_goes_with_the_service(
    api: FakeApi,
) -> None:
    def break_spec(reconciler: Reconciler) -> None:
        api.resource["metadata"]["generation"] = 2
        api.refuse = lambda m: "refused" if m["kind"] == "Deployment" else None

    reconciler = run(api, nothing)
    written = {(c["type"], c["status"]) for c in api.resource["status"]["conditions"]}
    assert ("Ready", "False") in written
    assert condition_series(*KEY) == dict.fromkeys(written, 1.0)

    reconciler = run(api, break_spec)
    written = {(c["type"], c["status"]) for c in api.resource["status"]["conditions"]}
    assert ("Degraded", "True") in written
    # Each condition has one series, at its current status: the old status's series is gone.
    assert condition_series(*KEY) == dict.fromkeys(written, 1.0)

    reconciler.resource_event("DELETED", api.resource)
    assert condition_series(*KEY) == {}


# --- prefill role (spec.prefill) -------------------------------------------------------------


def test_the_prefill_role_has_its_own_workload_and_status_and_goes_with_spec_prefill(
    api: FakeApi,
) -> None:
    api.resource["spec"] = {
        "model": "m",
        "engine": {"device": "cpu"},
        "prefill": {"replicas": 1},
        "routing": {},
    }
    prefill_id = ("apps/v1", "Deployment", "llama-prefill")
    seen: dict[str, Any] = {}

    def prefill_ready(reconciler: Reconciler) -> None:
        seen["applied"] = sorted(api.writes)
        seen["before"] = api.resource["status"]["prefill"]
        live = copy.deepcopy(api.objects[prefill_id])
        live["metadata"]["generation"] = 1
        live["metadata"]["resourceVersion"] = str(next(api.versions))
        live["status"] = {
            "observedGeneration": 1,
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
            "availableReplicas": 1,
            "conditions": [{"type": "Available", "status": "True", "reason": "Min"}],
        }
        api.objects[prefill_id] = live
        reconciler.child_event("MODIFIED", copy.deepcopy(live))

    def prefill_removed(reconciler: Reconciler) -> None:
        seen["ready"] = api.resource["status"]["prefill"]
        api.writes.clear()
        api.resource["metadata"]["generation"] = 2
        del api.resource["spec"]["prefill"]

    run(api, nothing, prefill_ready, prefill_removed)
    assert "apply Deployment" in seen["applied"]
    ready = {c["type"]: c["status"] for c in seen["before"]["conditions"]}
    assert ready["Ready"] == "False" and seen["before"]["readyReplicas"] == 0
    assert seen["ready"]["readyReplicas"] == 1
    assert {c["type"]: c["status"] for c in seen["ready"]["conditions"]}["Ready"] == "True"
    # The decode role's Ready is the resource's; its Deployment never became available here.
    assert condition(api, "Ready")["status"] == "False"
    assert "delete Deployment" in api.writes
    assert prefill_id not in api.objects
    assert "prefill" not in api.resource["status"]


def test_an_optional_kind_answering_404_while_listed_is_retried_quietly_then_reported(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a second or so after a CRD comes or goes, discovery lists its kind while its endpoint
    answers 404 (the e2e flake): a few quiet retries, then an error if it lasts."""
    applied = apply.apply
    unanswered = {"left": 0}

    def apply_or_404(api_client: Any, manifest: dict) -> dict:
        if manifest["kind"] == "ServiceMonitor" and unanswered["left"]:
            unanswered["left"] -= 1
            raise KubeError(404, "404 page not found")
        return applied(api_client, manifest)

    monkeypatch.setattr(apply, "apply", apply_or_404)
    seen: list[tuple[bool, float | None]] = []

    def monitoring_listed(reconciler: Reconciler) -> None:
        async def still_listed() -> None:
            pass  # rediscovery keeps saying it is served

        monkeypatch.setattr(reconciler.served, "rediscover", still_listed)
        reconciler.served.discovered = frozenset({"monitoring.coreos.com/v1/ServiceMonitor"})
        unanswered["left"] = 4

    def record(reconciler: Reconciler) -> None:
        degraded = [c for c in api.resource["status"]["conditions"] if c["type"] == "Degraded"]
        seen.append(
            (
                bool(degraded) and degraded[0]["status"] == "True",
                reconciler.failures.get(KEY),
            )
        )

    def answering_when_retried(reconciler: Reconciler) -> None:
        record(reconciler)
        retry = reconciler.retries[KEY]
        reconciler.retries[KEY] = module.Retry(retry.generation, 0.0, retry.delay, retry.error)

    reconciler = run(
        api, nothing, monitoring_listed, record, record, record, answering_when_retried
    )
    # Three quiet retries (1, 2 and 4 s), then the fourth 404 is the resource's error.
    assert seen == [(False, 1), (False, 2), (False, 3), (True, 4)]
    assert unanswered["left"] == 0
    assert ("monitoring.coreos.com/v1", "ServiceMonitor", "llama") in api.objects
    assert condition(api, "Ready")["reason"] != "ReconcileError"
    assert KEY not in reconciler.failures
