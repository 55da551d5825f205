"""A replica across nodes on the local control plane (issue 21, part 2): a TP 16 service on 8-GPU
kwok nodes waits with LeaderWorkerSetMissing while the LeaderWorkerSet API is absent, then,
once the real LWS controller (built from sigs.k8s.io/lws, cluster/lws.sh, run on the host with
its webhooks: cluster/lws_controller.py) and its CRDs are installed, becomes a LeaderWorkerSet
whose pods that controller creates on two nodes, the workers carrying the leader's address in
their env and the rendered multi-node args; the Service selects the leader; an edit of the
LeaderWorkerSet is reverted; TP 8 switches back
to a Deployment; deleting the service removes it all. Admission refuses impossible layouts
naming the field, and `kubectl explain` documents spec.gpu.perNode."""

import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    REPO,
    OperatorProcess,
    install_crds,
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)

sys.path.insert(0, str(REPO / "cluster"))

from lws_controller import LwsController  # found through the sys.path entry above

TIMEOUT = 240  # a loaded 2-core machine: the LWS manager and its webhooks start slowly
POOL_LABEL = "infernetes.io/e2e-pool"
NODE_TEMPLATE = REPO / "cluster" / "fake-gpu-node.yaml"


@pytest.fixture(scope="module")
def lws(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LwsController]:
    controller = LwsController(cluster, tmp_path_factory.mktemp("lws"))
    controller.remove_crds()  # start without the LWS API whatever ran before
    yield controller
    controller.stop()
    print(f"LWS controller log: {controller.log_path}")
    controller.remove_crds(wait=False)


@pytest.fixture(scope="module")
def pool(cluster: Any) -> Iterator[str]:
    """Two 8-GPU nodes of this module's own (the shared nodes may hold other modules' pods)."""
    pool = f"multinode-{uuid.uuid4().hex[:5]}"
    nodes = []
    for index in range(2):
        node = yaml.safe_load(NODE_TEMPLATE.read_text().replace("NODE_NAME", f"{pool}-{index}"))
        node["metadata"]["labels"][POOL_LABEL] = pool
        nodes.append(node)
    cluster.apply(nodes)
    names = [node["metadata"]["name"] for node in nodes]
    for name in names:
        cluster.kubectl("wait", "--for=condition=Ready", "--timeout=60s", f"node/{name}")
    yield pool
    cluster.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-multinode") as name:
        yield name


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, lws: LwsController, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator-multinode")) as process:
        yield process


def isvc(name: str, tp: int, **spec: Any) -> dict:
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "engine": {"tensorParallelSize": tp},
            **spec,
        },
    }


def env_of(pod: dict) -> dict[str, str]:
    container = pod["spec"]["containers"][0]
    return {item["name"]: item.get("value", "") for item in container.get("env") or ()}


def test_impossible_layouts_are_refused_naming_the_field(cluster: Any, ns: str) -> None:
    install_crds(cluster.kubectl)
    cases = [
        (isvc("bad", 16, gpu={"perNode": 0}), "spec.gpu.perNode", "greater than or equal to 1"),
        (isvc("bad", 12, gpu={"perNode": 8}), "spec.gpu.perNode", "multiple of it"),
        (
            isvc("bad", 16, gpu={"perNode": 8, "count": 32}),
            "spec.gpu.count",
            "must equal tensorParallelSize x pipelineParallelSize",
        ),
    ]
    dp = isvc("bad", 16, gpu={"perNode": 8})
    dp["spec"]["engine"]["dataParallelSize"] = 2
    cases.append((dp, "spec.engine.dataParallelSize", "takes engine.dataParallelSize 1"))
    ray = isvc("bad", 16, gpu={"perNode": 8})
    ray["spec"]["engine"]["distributedExecutorBackend"] = "ray"
    cases.append((ray, "spec.engine.distributedExecutorBackend", "would need a Ray cluster"))
    for resource, field, message in cases:
        result = cluster.kubectl(
            "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(resource), check=False
        )
        assert result.returncode != 0, resource
        assert field in result.stderr and message in result.stderr, result.stderr
    explained = cluster.kubectl("explain", "infsvc.spec.gpu.perNode").stdout
    assert "GPUs per node" in explained and "LeaderWorkerSet" in explained


def test_tp16_waits_for_the_lws_api_then_runs_on_two_nodes_and_goes_with_the_service(
    cluster: Any, ns: str, pool: str, lws: LwsController, operator: OperatorProcess
) -> None:
    name = "big"
    cluster.apply(isvc(name, 16, nodeSelector={POOL_LABEL: pool}), namespace=ns)

    # No LWS API: no workload, a condition and an event that say why.
    ready = wait_until(
        lambda: (
            (c := service_condition(cluster, ns, name, "Ready")).get("reason")
            == "LeaderWorkerSetMissing"
            and c
        ),
        timeout=TIMEOUT,
        what="Ready False with LeaderWorkerSetMissing",
    )
    assert ready["status"] == "False" and "spans 2 nodes" in ready["message"]
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    ).stdout
    assert "LeaderWorkerSetMissing" in events
    assert kubectl_get(cluster, ns, "deployment", name) is None

    # The LWS API and its controller appear: the operator converges on its own.
    lws.install_crds()
    lws.start()
    group = wait_until(
        lambda: kubectl_get(cluster, ns, "leaderworkersets.leaderworkerset.x-k8s.io", name),
        timeout=TIMEOUT,
        what="the LeaderWorkerSet",
    )
    assert group["spec"]["leaderWorkerTemplate"]["size"] == 2

    def pods() -> list[dict] | None:
        listed = kubectl_get(cluster, ns, "pods", "-l", f"app.kubernetes.io/instance={name}")
        items = [p for p in (listed or {}).get("items", []) if p["spec"].get("nodeName")]
        return items if len(items) == 2 else None

    both = wait_until(pods, timeout=TIMEOUT, what="the leader and the worker pod, scheduled")
    by_role = {p["metadata"]["labels"]["infernetes.io/role"]: p for p in both}
    leader, worker = by_role["leader"], by_role["worker"]
    assert {leader["spec"]["nodeName"], worker["spec"]["nodeName"]} == {f"{pool}-0", f"{pool}-1"}
    leader_env, worker_env = env_of(leader), env_of(worker)
    # The LWS pod webhook put the group's facts into the env; both name the leader's address.
    assert worker_env["LWS_LEADER_ADDRESS"] == leader_env["LWS_LEADER_ADDRESS"]
    assert worker_env["LWS_LEADER_ADDRESS"].startswith(f"{name}-0.{name}.{ns}")
    assert worker_env["LWS_WORKER_INDEX"] == "1" and leader_env["LWS_WORKER_INDEX"] == "0"
    assert worker_env["LWS_GROUP_SIZE"] == "2"
    leader_args = leader["spec"]["containers"][0]["args"]
    worker_args = worker["spec"]["containers"][0]["args"]
    assert "--tensor-parallel-size=16" in leader_args and "--tensor-parallel-size=16" in worker_args
    assert leader_args[-8:] == [
        "--nnodes", "2", "--node-rank", "0",
        "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", "29501",
    ]  # fmt: skip
    assert worker_args[-9:] == [
        "--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)",
        "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", "29501", "--headless",
    ]  # fmt: skip
    for pod in both:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == 8
    assert "readinessProbe" in leader["spec"]["containers"][0]
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    service = kubectl_get(cluster, ns, "service", name)
    assert service["spec"]["selector"]["infernetes.io/role"] == "leader"

    # kwok makes the pods ready: the LWS reports its group ready, and so does the service.
    wait_until(
        lambda: service_condition(cluster, ns, name, "Ready").get("status") == "True",
        timeout=TIMEOUT,
        what="Ready True from the LeaderWorkerSet's status",
    )
    status = kubectl_get(cluster, ns, "infsvc", name)["status"]
    assert status["readyReplicas"] == 1 and status["gpusPerReplica"] == 16

    # Someone edits the LeaderWorkerSet's worker image: the operator puts its own back.
    path = "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/image"
    image = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "image"
    ]
    cluster.kubectl(
        "patch", "leaderworkersets.leaderworkerset.x-k8s.io", name, "-n", ns, "--type=json",
        "-p", f'[{{"op":"replace","path":"{path}","value":"someone/else:1"}}]',
    )  # fmt: skip

    def worker_image() -> str:
        live = kubectl_get(cluster, ns, "leaderworkersets.leaderworkerset.x-k8s.io", name)
        return live["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
            "image"
        ]

    wait_until(lambda: worker_image() == image, timeout=TIMEOUT, what="the worker image restored")

    # TP 8 fits a node: a Deployment again, the LeaderWorkerSet removed.
    cluster.kubectl(
        "patch", "infsvc", name, "-n", ns, "--type=merge",
        "-p", '{"spec":{"engine":{"tensorParallelSize":8}}}',
    )  # fmt: skip
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "deployment", name)
            and kubectl_get(cluster, ns, "leaderworkersets.leaderworkerset.x-k8s.io", name) is None
        ),
        timeout=TIMEOUT,
        what="the Deployment in place of the LeaderWorkerSet",
    )

    # Back to TP 16, then the service deleted: the LeaderWorkerSet and its pods go with it.
    cluster.kubectl(
        "patch", "infsvc", name, "-n", ns, "--type=merge",
        "-p", '{"spec":{"engine":{"tensorParallelSize":16}}}',
    )  # fmt: skip
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "leaderworkersets.leaderworkerset.x-k8s.io", name)
            and kubectl_get(cluster, ns, "deployment", name) is None
        ),
        timeout=TIMEOUT,
        what="the LeaderWorkerSet in place of the Deployment",
    )
    cluster.kubectl("delete", "infsvc", name, "-n", ns)
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "leaderworkersets.leaderworkerset.x-k8s.io", name) is None
            and not (
                kubectl_get(cluster, ns, "pods", "-l", f"app.kubernetes.io/instance={name}") or {}
            ).get("items")
        ),
        timeout=TIMEOUT,
        what="the LeaderWorkerSet and its pods deleted",
    )
