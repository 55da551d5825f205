"""The operator against the local control plane: create, roll, scale, fail to schedule, delete,
survive a kill, and do it all with only its least-privilege RBAC.

The operator runs as a process (`infernetes operator run`) with a token of its own
ServiceAccount, bound to the ClusterRole that `infernetes operator rbac` prints. kwok runs the
pods on fake GPU nodes (2 x 8 nvidia.com/gpu), so Deployments become Available without a runtime.
"""

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    OperatorProcess,
    install_crds,
    kubectl_get,
    service_account_kubeconfig,
    wait_until,
)

TIMEOUT = 90


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    name = f"e2e-operator-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    wait_until(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=60,
        what="the default ServiceAccount",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    install_crds(cluster.kubectl)
    workdir = tmp_path_factory.mktemp("operator")
    kubeconfig = service_account_kubeconfig(
        cluster.kubectl, namespace=ns, path=workdir / "kubeconfig"
    )
    process = OperatorProcess(
        kubeconfig=kubeconfig, log_path=workdir / "operator.log", namespaces=[ns], env=cluster.env
    )
    process.start()
    yield process
    process.stop()
    print(f"operator log: {process.log_path}")


def isvc(name: str, **spec: Any) -> dict:
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": "meta-llama/Llama-3.1-8B-Instruct", **spec},
    }


def condition(resource: Any, kind: str) -> dict:
    for cond in ((resource or {}).get("status") or {}).get("conditions") or ():
        if cond["type"] == kind:
            return cond
    return {}


def wait_condition(
    cluster: Any, ns: str, name: str, kind: str, status: str, timeout: float = TIMEOUT
) -> dict:
    def check() -> Any:
        resource = kubectl_get(cluster, ns, "infsvc", name)
        return resource if condition(resource, kind).get("status") == status else None

    try:
        return wait_until(check, timeout=timeout, what=f"{name} {kind}={status}")
    except TimeoutError:
        print(yaml.safe_dump((kubectl_get(cluster, ns, "infsvc", name) or {}).get("status")))
        raise


def test_operator_health_and_discovery(operator: OperatorProcess) -> None:
    assert operator.get(operator.health_port, "/healthz")[0] == 200
    assert "infernetes_operator_reconciles_total" in operator.metrics()
    # Other modules' optional APIs (KEDA's, LWS's) may still be going when this one starts.
    served = [line for line in operator.log().splitlines() if "optional APIs served:" in line]
    assert served and "monitoring.coreos.com/v1/PodMonitor" in served[0]
    assert "monitoring.coreos.com/v1/ServiceMonitor" in served[0]


def test_resource_gets_children_and_becomes_ready(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("llama", gpu={"count": 2}, engine={"maxModelLen": "8k"}), namespace=ns)
    resource = wait_condition(cluster, ns, "llama", "Ready", "True")
    status = resource["status"]
    assert status["url"] == f"http://llama.{ns}.svc:8000/v1"
    assert status["modelName"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert status["gpusPerReplica"] == 2
    assert status["readyReplicas"] == 1
    assert condition(resource, "Scheduled")["status"] == "True"
    assert condition(resource, "Degraded")["status"] == "False"
    assert condition(resource, "Ready")["observedGeneration"] == resource["metadata"]["generation"]

    deployment = kubectl_get(cluster, ns, "deployment", "llama")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--max-model-len=8k" in container["args"]
    assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False
    owner = deployment["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "InferenceService" and owner["uid"] == resource["metadata"]["uid"]
    fields = kubectl_get(cluster, ns, "deployment", "llama", "--show-managed-fields")["metadata"][
        "managedFields"
    ]
    managers = {entry["manager"] for entry in fields if entry["operation"] == "Apply"}
    assert managers == {"infernetes"}
    assert kubectl_get(cluster, ns, "service", "llama")["spec"]["ports"][0]["targetPort"] == "http"
    monitor = kubectl_get(cluster, ns, "servicemonitor", "llama")
    assert monitor["spec"]["endpoints"][0]["port"] == "http"

    columns = cluster.kubectl("get", "infsvc", "llama", "-n", ns).stdout
    header, row = columns.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "MODEL", "READY", "REPLICAS", "AVAILABLE", "GPUS"]
    assert row.split()[1:6] == ["meta-llama/Llama-3.1-8B-Instruct", "True", "1", "1", "2"]


def test_engine_change_rolls_the_deployment(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("roll", engine={"maxNumSeqs": 8}), namespace=ns)
    wait_condition(cluster, ns, "roll", "Ready", "True")
    before = kubectl_get(cluster, ns, "deployment", "roll")
    cluster.kubectl(
        "patch",
        "infsvc",
        "roll",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"maxNumSeqs":16}}}',
    )

    def rolled() -> Any:
        deployment = kubectl_get(cluster, ns, "deployment", "roll")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return deployment if "--max-num-seqs=16" in args else None

    after = wait_until(rolled, timeout=TIMEOUT, what="the new argv in the Deployment")
    assert after["metadata"]["generation"] > before["metadata"]["generation"]

    def ready_for_new_generation() -> Any:
        resource = kubectl_get(cluster, ns, "infsvc", "roll")
        generation = resource["metadata"]["generation"]
        ready = condition(resource, "Ready")
        current = (
            resource["status"].get("observedGeneration")
            == generation
            == ready.get("observedGeneration")
        )
        return resource if current and ready.get("status") == "True" else None

    resource = wait_until(ready_for_new_generation, timeout=TIMEOUT, what="Ready for generation 2")
    assert resource["metadata"]["generation"] == 2

    def new_pods_only() -> bool:
        pods = kubectl_get(cluster, ns, "pods", "-l", "app.kubernetes.io/instance=roll")["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return bool(live) and all(
            "--max-num-seqs=16" in p["spec"]["containers"][0]["args"] for p in live
        )

    wait_until(new_pods_only, timeout=TIMEOUT, what="pods with the new argv only")


def test_kubectl_scale(cluster: Any, ns: str, operator: OperatorProcess) -> None:
    cluster.apply(isvc("scaled", engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "scaled", "Ready", "True")
    cluster.kubectl("scale", "infsvc", "scaled", "-n", ns, "--replicas=3")
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "deployment", "scaled")["status"].get("readyReplicas") == 3
        ),
        timeout=TIMEOUT,
        what="3 ready replicas",
    )
    wait_until(
        lambda: kubectl_get(cluster, ns, "infsvc", "scaled")["status"].get("readyReplicas") == 3,
        timeout=TIMEOUT,
        what="status.readyReplicas 3",
    )
    scale = yaml.safe_load(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/infernetes.io/v1alpha1/namespaces/{ns}/inferenceservices/scaled/scale",
        ).stdout
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert (
        scale["status"]["selector"]
        == "app.kubernetes.io/instance=scaled,app.kubernetes.io/name=infernetes"
    )


def test_a_pod_no_node_takes_is_unschedulable(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    # A GPU product no node has: the pod is created and stays Pending (a replica larger than
    # any node is not rendered at all: test_operator_node_fit.py).
    cluster.apply(isvc("huge", gpu={"count": 1, "product": "NVIDIA-B200"}), namespace=ns)
    resource = wait_condition(cluster, ns, "huge", "Scheduled", "False")
    message = condition(resource, "Scheduled")["message"]
    assert "node affinity/selector" in message
    assert condition(resource, "Ready")["status"] == "False"
    assert condition(resource, "Ready")["reason"] == "Unschedulable"
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=huge"
    ).stdout
    assert "Unschedulable" in events


def test_gpus_claimed_through_dra_give_each_pod_a_claim_of_the_device_class(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    # resource.k8s.io/v1 is served by the API server itself (Kubernetes 1.34+); no DRA driver
    # runs here, so the pod stays Pending with its claim unallocated, as on a cluster whose
    # driver has no free device.
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.e2e.infernetes.io"},
            "spec": {},
        }
    )
    spec = {
        "engine": {"tensorParallelSize": 2},
        "gpu": {"deviceClassName": "gpu.e2e.infernetes.io"},
    }
    cluster.apply(isvc("claimed", **spec), namespace=ns)
    selector = "app.kubernetes.io/instance=claimed"

    def listed(kind: str) -> list[dict]:
        found = (
            kubectl_get(cluster, ns, kind, "-l", selector)
            if kind != "resourceclaims"
            else (kubectl_get(cluster, ns, kind))
        )
        return (found or {}).get("items") or []

    (template,) = wait_until(
        lambda: listed("resourceclaimtemplates"), timeout=TIMEOUT, what="the ResourceClaimTemplate"
    )
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.e2e.infernetes.io"
    assert request["exactly"]["count"] == 2
    pod = wait_until(lambda: listed("pods"), timeout=TIMEOUT, what="a pod of claimed")[0]
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    assert "nvidia.com/gpu" not in (container["resources"].get("limits") or {})

    # The API server's resource-claim controller made the pod its own claim from the template.
    def pods_claim() -> list[dict]:
        return [
            claim
            for claim in listed("resourceclaims")
            if any(
                ref["name"] == pod["metadata"]["name"]
                for ref in claim["metadata"].get("ownerReferences") or ()
            )
        ]

    (claim,) = wait_until(pods_claim, timeout=TIMEOUT, what="the pod's ResourceClaim")
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    cluster.kubectl("delete", "infsvc", "claimed", "-n", ns)
    cluster.kubectl("delete", "deviceclass", "gpu.e2e.infernetes.io")


def test_resource_named_vllm_gets_another_service_name(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("vllm", engine={"device": "cpu"}), namespace=ns)
    resource = wait_condition(cluster, ns, "vllm", "Ready", "True")
    assert resource["status"]["serviceName"] == "infsvc-vllm"
    assert "VLLM_PORT" in resource["status"]["warnings"][0]
    assert kubectl_get(cluster, ns, "service", "infsvc-vllm") is not None
    assert kubectl_get(cluster, ns, "service", "vllm") is None


def test_settings_without_effect_are_a_condition_and_one_event_each(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    engine = {"device": "cpu", "swapSpace": 8, "maxModelLen": 2048}
    cluster.apply(
        isvc("ignoring", engine=engine, engineEnv={"VLLM_NO_USAGE_STATS": True}), namespace=ns
    )
    resource = wait_condition(cluster, ns, "ignoring", "SettingsIgnored", "True")
    ignored = condition(resource, "SettingsIgnored")
    assert (
        ignored["reason"] == "NoEffect"
        and ignored["observedGeneration"] == resource["metadata"]["generation"]
    )
    assert (
        "spec.engine.swapSpace: argument --swap-space 8.0 has no effect here" in ignored["message"]
    )
    assert (
        "spec.engineEnv.VLLM_NO_USAGE_STATS" in ignored["message"]
        and "maxModelLen" not in ignored["message"]
    )
    assert any("spec.engine.swapSpace" in warning for warning in resource["status"]["warnings"])

    def events() -> list[dict]:
        listed = kubectl_get(
            cluster, ns, "events", "--field-selector", "involvedObject.name=ignoring"
        )["items"]
        return [e for e in listed if e["reason"] == "SettingIgnored"]

    wait_until(lambda: len(events()) == 2, timeout=TIMEOUT, what="a SettingIgnored event per field")
    assert {e["message"].split(":")[0] for e in events()} == {
        "spec.engine.swapSpace",
        "spec.engineEnv.VLLM_NO_USAGE_STATS",
    }
    assert all(e["type"] == "Warning" for e in events())

    # A change elsewhere re-renders without telling again; dropping the settings clears the condition.
    cluster.kubectl(
        "patch",
        "infsvc",
        "ignoring",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"maxNumSeqs":8}}}',
    )
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "infsvc", "ignoring")["status"].get("observedGeneration") == 2
        ),
        timeout=TIMEOUT,
        what="generation 2 reconciled",
    )
    patch = '{"spec":{"engine":{"swapSpace":null},"engineEnv":null}}'
    cluster.kubectl("patch", "infsvc", "ignoring", "-n", ns, "--type=merge", "-p", patch)
    resource = wait_condition(cluster, ns, "ignoring", "SettingsIgnored", "False")
    assert condition(resource, "SettingsIgnored")["reason"] == "AllSettingsTakeEffect"
    assert len(events()) == 2


def test_crash_loop_is_degraded_with_the_termination_message(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("crashy", engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "crashy", "Ready", "True")
    pod = kubectl_get(cluster, ns, "pods", "-l", "app.kubernetes.io/instance=crashy")["items"][0]
    # kwok runs no containers; write what the kubelet reports for a server that keeps exiting.
    crashed = {
        "status": {
            "containerStatuses": [
                {
                    "name": "server",
                    "image": pod["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 5,
                    "state": {
                        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s"}
                    },
                    "lastState": {
                        "terminated": {
                            "exitCode": 2,
                            "reason": "Error",
                            "message": "infernetes serve: error: --max-model-len 99999 exceeds the model's 2048",
                        }
                    },
                }
            ]
        }
    }
    cluster.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        ns,
        "--subresource=status",
        "--type=strategic",
        "-p",
        yaml.safe_dump(crashed),
    )
    resource = wait_condition(cluster, ns, "crashy", "Degraded", "True")
    message = condition(resource, "Degraded")["message"]
    assert condition(resource, "Degraded")["reason"] == "CrashLoopBackOff"
    assert "exceeds the model's 2048" in message and "exit code 2" in message
    events = cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=crashy"
    ).stdout
    assert "CrashLoopBackOff" in events


def test_deleted_child_is_recreated(cluster: Any, ns: str, operator: OperatorProcess) -> None:
    cluster.apply(isvc("healing", engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "healing", "Ready", "True")
    uid = kubectl_get(cluster, ns, "deployment", "healing")["metadata"]["uid"]
    cluster.kubectl("delete", "deployment", "healing", "-n", ns)
    wait_until(
        lambda: (
            (kubectl_get(cluster, ns, "deployment", "healing") or {}).get("metadata", {}).get("uid")
            not in (None, uid)
        ),
        timeout=TIMEOUT,
        what="a new Deployment",
    )


def uid_of(cluster: Any, ns: str, kind: str, name: str) -> str | None:
    return ((kubectl_get(cluster, ns, kind, name) or {}).get("metadata") or {}).get("uid")


def events_of(cluster: Any, ns: str, name: str, reason: str) -> list[dict]:
    listed = kubectl_get(cluster, ns, "events", "--field-selector", f"involvedObject.name={name}")
    return [e for e in listed["items"] if e["reason"] == reason]


def test_every_child_is_restored_after_delete_or_edit(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("drift", replicas=2, engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "drift", "Ready", "True")
    children = ["deployment", "service", "servicemonitor", "poddisruptionbudget"]
    for kind in children:
        old = uid_of(cluster, ns, kind, "drift")
        assert old, kind
        cluster.kubectl("delete", kind, "drift", "-n", ns)
        wait_until(
            lambda kind=kind, old=old: uid_of(cluster, ns, kind, "drift") not in (None, old),
            timeout=TIMEOUT,
            what=f"a new {kind}",
        )
    # Edits by another manager (kubectl's merge patch is an update of the whole object).
    edits = {
        "deployment": '{"spec":{"replicas":5,"template":{"spec":{"containers":[{"name":"server","image":"evil:1"}]}}}}',
        "service": '{"spec":{"ports":[{"name":"http","port":9999,"targetPort":"http"}]}}',
    }
    for kind, patch in edits.items():
        cluster.kubectl("patch", kind, "drift", "-n", ns, "--type=merge", "-p", patch)

    def restored() -> bool:
        deployment = kubectl_get(cluster, ns, "deployment", "drift")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        port = kubectl_get(cluster, ns, "service", "drift")["spec"]["ports"][0]["port"]
        return (
            deployment["spec"]["replicas"] == 2 and container["image"] != "evil:1" and port == 8000
        )

    wait_until(restored, timeout=TIMEOUT, what="the edited Deployment and Service restored")
    wait_condition(cluster, ns, "drift", "Ready", "True")
    # The user was told, once per repair (the status said Ready False meanwhile: unit tests).
    repairs = events_of(cluster, ns, "drift", "Repairing")
    assert repairs and all(e["type"] == "Warning" for e in repairs)
    assert any("Service drift: missing" in e["message"] for e in repairs)


def test_replicas_set_through_the_scale_subresource_are_left_alone(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    """An HPA or KEDA scales the Deployment through /scale; the operator leaves replicas to it."""
    cluster.apply(isvc("autoscaled", engine={"device": "cpu", "maxNumSeqs": 8}), namespace=ns)
    wait_condition(cluster, ns, "autoscaled", "Ready", "True")
    cluster.kubectl("scale", "deployment", "autoscaled", "-n", ns, "--replicas=3")
    cluster.kubectl(
        "patch",
        "infsvc",
        "autoscaled",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"maxNumSeqs":16}}}',
    )

    def rolled() -> Any:
        deployment = kubectl_get(cluster, ns, "deployment", "autoscaled")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return deployment if "--max-num-seqs=16" in args else None

    deployment = wait_until(rolled, timeout=TIMEOUT, what="the new argv")
    assert deployment["spec"]["replicas"] == 3
    resource = wait_until(
        lambda: (
            (r := kubectl_get(cluster, ns, "infsvc", "autoscaled"))["status"].get("readyReplicas")
            == 3
            and r
        ),
        timeout=TIMEOUT,
        what="3 ready replicas reported",
    )
    assert resource["status"]["observedGeneration"] == resource["metadata"]["generation"]


def test_apply_error_is_a_condition_with_backoff(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("refused", engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "refused", "Ready", "True")
    # The CRD keeps affinity free-form; the Deployment's own validation refuses this one.
    bad = '{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[]}}}}}'
    cluster.kubectl("patch", "infsvc", "refused", "-n", ns, "--type=merge", "-p", bad)
    resource = wait_condition(cluster, ns, "refused", "Degraded", "True")
    degraded = condition(resource, "Degraded")
    assert degraded["reason"] == "ReconcileError"
    assert "applying Deployment refused:" in degraded["message"]
    assert "nodeSelectorTerms" in degraded["message"]  # the API server's own words
    assert condition(resource, "Ready")["status"] == "False"
    assert condition(resource, "Ready")["observedGeneration"] == 2
    assert resource["status"]["observedGeneration"] == 1
    # Retried with growing delays, told once.
    wait_until(
        lambda: (
            "refused: applying Deployment refused" in operator.log()
            and "(retry in 4s)" in operator.log()
        ),
        timeout=TIMEOUT,
        what="three attempts",
    )
    retries = [
        line.rsplit("(retry in ", 1)[1].rstrip(")")
        for line in operator.log().splitlines()
        if "/refused: applying Deployment refused" in line
    ]
    assert retries[:3] == ["1s", "2s", "4s"]
    assert len(events_of(cluster, ns, "refused", "ReconcileError")) == 1
    cluster.kubectl(
        "patch",
        "infsvc",
        "refused",
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/affinity"}]',
    )

    def recovered() -> Any:
        resource = kubectl_get(cluster, ns, "infsvc", "refused")
        ready = condition(resource, "Ready")
        return ready.get("status") == "True" and resource["status"]["observedGeneration"] == 3

    wait_until(recovered, timeout=TIMEOUT, what="Ready again at generation 3")
    assert condition(kubectl_get(cluster, ns, "infsvc", "refused"), "Degraded")["status"] == "False"


def test_a_claim_several_replicas_cannot_share_is_reported(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "single-node-cache"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.apply(claim, namespace=ns)
    spec = {
        "replicas": 3,
        "engine": {"device": "cpu"},
        "modelCache": {"claimName": claim["metadata"]["name"]},
    }
    cluster.apply(isvc("cached", **spec), namespace=ns)
    resource = wait_condition(cluster, ns, "cached", "ClaimsShared", "False")
    message = condition(resource, "ClaimsShared")["message"]
    assert condition(resource, "ClaimsShared")["reason"] == "ReadWriteOnce"
    assert message.startswith("spec.modelCache.claimName: PersistentVolumeClaim single-node-cache")
    assert "3 replicas" in message
    wait_until(
        lambda: events_of(cluster, ns, "cached", "ReadWriteOnce"), timeout=TIMEOUT, what="an event"
    )
    cluster.kubectl(
        "patch", "infsvc", "cached", "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":1}}'
    )
    wait_condition(cluster, ns, "cached", "ClaimsShared", "True")


def test_deleting_the_resource_removes_everything(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("doomed", engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "doomed", "Ready", "True")
    cluster.kubectl("delete", "infsvc", "doomed", "-n", ns, "--wait=true")
    selector = "app.kubernetes.io/instance=doomed"

    def gone() -> bool:
        left = kubectl_get(
            cluster, ns, "deployments,services,servicemonitors,pods", "-l", selector
        )["items"]
        return not left

    wait_until(gone, timeout=TIMEOUT, what="the garbage collector to remove the children")


def test_condition_metric_follows_the_status_and_goes_with_the_resource(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    """infernetes_operator_inference_service_condition, which the operator dashboard counts."""
    from prometheus_client.parser import text_string_to_metric_families

    def ready() -> set[str]:
        """The Ready statuses the operator's /metrics holds for the service."""
        return {
            sample.labels["status"]
            for family in text_string_to_metric_families(operator.metrics())
            if family.name == "infernetes_operator_inference_service_condition"
            for sample in family.samples
            if sample.labels["inference_service"] == "counted"
            and sample.labels["inference_service_namespace"] == ns
            and sample.labels["condition"] == "Ready"
            and sample.value == 1
        }

    cluster.apply(isvc("counted", engine={"device": "cpu"}), namespace=ns)
    wait_condition(cluster, ns, "counted", "Ready", "True")
    wait_until(lambda: ready() == {"True"}, timeout=TIMEOUT, what="Ready=True in /metrics")
    cluster.kubectl("delete", "infsvc", "counted", "-n", ns, "--wait=true")
    wait_until(lambda: not ready(), timeout=TIMEOUT, what="the deleted service's series to go")


def test_kill_mid_reconcile_converges_without_orphans(
    cluster: Any, ns: str, operator: OperatorProcess, api_client: Any
) -> None:
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    names = [f"burst-{i}" for i in range(40)]
    operator.kill()
    cluster.apply([isvc(name, engine={"device": "cpu"}) for name in names], namespace=ns)

    def burst_deployments() -> list[str]:
        items = apps.list_namespaced_deployment(ns).items
        return [d.metadata.name for d in items if d.metadata.name.startswith("burst-")]

    operator.start(wait=False)
    # Kill it again as soon as it has created the first child: the other handlers are in flight.
    wait_until(burst_deployments, timeout=TIMEOUT, what="the first burst Deployment", interval=0.02)
    operator.kill()
    created_while_running = len(burst_deployments())
    operator.start()
    for name in names:
        wait_condition(cluster, ns, name, "Ready", "True")
    assert sorted(burst_deployments()) == sorted(names)
    services = [
        s
        for s in kubectl_get(cluster, ns, "services")["items"]
        if s["metadata"]["name"].startswith("burst-")
    ]
    assert sorted(s["metadata"]["name"] for s in services) == sorted(names)
    owners = {r["metadata"]["uid"] for r in kubectl_get(cluster, ns, "infsvc")["items"]}
    managed = kubectl_get(
        cluster,
        ns,
        "deployments,services,servicemonitors",
        "-l",
        "app.kubernetes.io/managed-by=infernetes",
    )
    orphans = [
        f"{item['kind']}/{item['metadata']['name']}"
        for item in managed["items"]
        if {ref["uid"] for ref in item["metadata"].get("ownerReferences", [])}.isdisjoint(owners)
    ]
    assert orphans == []
    print(
        f"{created_while_running} of {len(names)} Deployments existed when the operator was killed"
    )


def writes(operator: OperatorProcess) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in operator.metrics().splitlines()
        if line.startswith("infernetes_operator_api_writes_total{")
    )


def test_status_survives_an_idle_period(cluster: Any, ns: str, operator: OperatorProcess) -> None:
    # Level-based and idempotent: with nothing changing, the operator writes nothing.
    before = kubectl_get(cluster, ns, "infsvc", "llama")["metadata"]["resourceVersion"]
    deployment = kubectl_get(cluster, ns, "deployment", "llama")["metadata"]["resourceVersion"]
    written = writes(operator)
    time.sleep(3)
    assert kubectl_get(cluster, ns, "infsvc", "llama")["metadata"]["resourceVersion"] == before
    assert (
        kubectl_get(cluster, ns, "deployment", "llama")["metadata"]["resourceVersion"] == deployment
    )
    assert writes(operator) == written


def test_operator_log_has_no_permission_errors(operator: OperatorProcess) -> None:
    log = operator.log()
    # A missing RBAC rule shows up as "... is forbidden: User "system:serviceaccount:..." cannot ...".
    assert "forbidden" not in log.lower(), Path(operator.log_path).read_text()[-3000:]
