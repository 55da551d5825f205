"""A replica across nodes: when render makes a LeaderWorkerSet, what its leader and worker
templates hold, and the LeaderWorkerSet's status in the Deployment's terms (the golden file
multinode-tp16 shows the whole manifest; the e2e runs the real LWS controller)."""

from typing import Any

import pytest
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.multinode import LWS_MISSING, as_deployment_view
from infernetes.operator.render import SERVER, plan
from infernetes.operator.render.leaderworkerset import MASTER_PORT, Layout, layout, node_args
from infernetes.operator.render.workload import container_args
from infernetes.operator.status import derive_status

LWS_API = frozenset({"leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"})
SERVED = ClusterFacts(apis=LWS_API)
EIGHT_GPU_NODES = ClusterFacts(apis=LWS_API, gpus_per_node={"nvidia.com/gpu": 8})


def tp(size: int, **spec: Any) -> dict[str, Any]:
    return {"model": "x", "engine": {"tensorParallelSize": size}, **spec}


@pytest.mark.parametrize(
    ("spec", "facts", "expected"),
    [
        (tp(8), EIGHT_GPU_NODES, Layout(1, 8)),
        (tp(16), EIGHT_GPU_NODES, Layout(2, 8)),
        (tp(32), EIGHT_GPU_NODES, Layout(4, 8)),
        (tp(16, gpu={"perNode": 4}), EIGHT_GPU_NODES, Layout(4, 4)),  # the spec wins
        (tp(16, gpu={"perNode": 16}), EIGHT_GPU_NODES, Layout(1, 16)),
        (tp(16), SERVED, Layout(1, 16)),  # no GPU node known: one pod
        (
            {"model": "x", "engine": {"tensorParallelSize": 8, "pipelineParallelSize": 2}},
            EIGHT_GPU_NODES,
            Layout(2, 8),
        ),
        (
            {"model": "x", "engine": {"device": "cpu", "tensorParallelSize": 16}},
            EIGHT_GPU_NODES,
            Layout(1, 0),
        ),
    ],
)
def test_layout(spec: dict, facts: ClusterFacts, expected: Layout) -> None:
    assert layout(spec, facts) == expected


def test_a_size_that_does_not_split_into_whole_nodes_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\(12 GPUs\) exceeds one node \(8 GPUs, the largest"):
        layout(tp(12), EIGHT_GPU_NODES)
    with pytest.raises(ValueError, match=r"spec\.gpu\.perNode"):
        layout(tp(16, gpu={"perNode": 6}), EIGHT_GPU_NODES)
    with pytest.raises(ValueError, match="dataParallelSize 1"):
        layout(
            {"model": "x", "engine": {"tensorParallelSize": 16, "dataParallelSize": 2}},
            EIGHT_GPU_NODES,
        )
    ray = {"tensorParallelSize": 16, "distributedExecutorBackend": "ray"}
    with pytest.raises(ValueError, match="ray would need a Ray cluster across those pods"):
        layout({"model": "x", "engine": ray}, EIGHT_GPU_NODES)
    assert layout({"model": "x", "engine": {**ray, "tensorParallelSize": 8}}, EIGHT_GPU_NODES)


def lws_of(spec: dict, facts: ClusterFacts = EIGHT_GPU_NODES) -> dict[str, Any]:
    result = plan(spec, facts, name="big", namespace="ns")
    workload = result.workloads[SERVER]
    assert workload["kind"] == "LeaderWorkerSet"
    assert "Deployment" not in {m["kind"] for m in result.manifests}
    return workload


def test_leader_and_workers_run_the_usual_argv_plus_their_node_rank() -> None:
    spec = tp(16, replicas=3)
    lws = lws_of(spec)["spec"]
    assert lws["replicas"] == 3
    group = lws["leaderWorkerTemplate"]
    assert group["size"] == 2
    leader = group["leaderTemplate"]["spec"]["containers"][0]
    worker = group["workerTemplate"]["spec"]["containers"][0]
    usual = container_args(spec, ClusterFacts())
    assert "--tensor-parallel-size=16" in usual
    port = str(MASTER_PORT)
    assert leader["args"] == [
        *usual,
        *["--nnodes", "2", "--node-rank", "0", "--master-addr", "$(LWS_LEADER_ADDRESS)"],
        *["--master-port", port],
    ]
    assert worker["args"] == [
        *usual,
        *["--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)"],
        *["--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", port, "--headless"],
    ]
    assert node_args(4, "worker")[1] == "4"


def test_each_pod_holds_a_nodes_gpus_and_only_the_leader_serves() -> None:
    group = lws_of(tp(16, image="reg/img:1"))["spec"]["leaderWorkerTemplate"]
    leader_pod, worker_pod = group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]
    leader, worker = leader_pod["containers"][0], worker_pod["containers"][0]
    for container in (leader, worker):
        assert container["image"] == "reg/img:1"
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
        assert container["resources"]["requests"]["cpu"] == "32"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    for pod in (leader_pod, worker_pod):
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["sizeLimit"] == "16Gi"  # per pod: 8 GPUs
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {"startupProbe", "readinessProbe", "livenessProbe", "ports"} <= set(leader)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(worker)
    roles = [
        group[t]["metadata"]["labels"]["infernetes.io/role"]
        for t in ("leaderTemplate", "workerTemplate")
    ]
    assert roles == ["leader", "worker"]


def test_the_service_selects_the_leaders() -> None:
    result = plan(tp(16), EIGHT_GPU_NODES, name="big", namespace="ns")
    service = next(m for m in result.manifests if m["kind"] == "Service")
    assert service["spec"]["selector"]["infernetes.io/role"] == "leader"
    assert result.nodes_per_replica == 2 and result.gpus_per_pod == 8
    assert result.gpus_per_replica == 16
    single = plan(tp(8), EIGHT_GPU_NODES, name="big", namespace="ns")
    service = next(m for m in single.manifests if m["kind"] == "Service")
    assert "infernetes.io/role" not in service["spec"]["selector"]


def test_rollout_surges_a_group_only_when_asked() -> None:
    def config(strategy: str) -> dict:
        spec = tp(16, rollout={"strategy": strategy})
        return lws_of(spec)["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]

    assert config("Auto") == {"maxSurge": 0, "maxUnavailable": 1}
    assert config("Recreate") == {"maxSurge": 0, "maxUnavailable": 1}
    assert config("RollingUpdate") == {"maxSurge": 1, "maxUnavailable": 0}


def test_without_the_lws_api_no_workload_and_a_reason() -> None:
    facts = ClusterFacts(gpus_per_node={"nvidia.com/gpu": 8})
    result = plan(tp(16), facts, name="big", namespace="ns")
    assert {m["kind"] for m in result.manifests} == {"Service"}
    assert result.workloads == {}
    assert result.blocked is not None
    reason, message = result.blocked
    assert reason == LWS_MISSING
    assert "spans 2 nodes" in message and "leaderworkerset.x-k8s.io/v1" in message


def test_the_lws_status_reads_as_a_deployments() -> None:
    lws = {
        "metadata": {"generation": 2},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 2,
            "replicas": 2,
            "readyReplicas": 1,
            "updatedReplicas": 2,
            "conditions": [
                {"type": "Available", "status": "False", "reason": "NotAllGroupsReady"},
                {"type": "UpdateInProgress", "status": "False"},
            ],
        },
    }
    view = as_deployment_view(lws)
    status = derive_status(
        generation=1, desired_replicas=2, deployment=view, pods=[], previous=None, now="t"
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and status["readyReplicas"] == 1
    lws["status"]["readyReplicas"] = 2
    lws["status"]["conditions"][0] = {"type": "Available", "status": "True", "reason": "Ready"}
    status = derive_status(
        generation=1,
        desired_replicas=2,
        deployment=as_deployment_view(lws),
        pods=[],
        previous=None,
        now="t",
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and status["readyReplicas"] == 2
