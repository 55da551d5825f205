"""Security by default against the local control plane: in a namespace that enforces the
`restricted` Pod Security Standard (the API server's PodSecurity admission, on by default), the
pods of an operator-rendered Deployment are admitted as rendered, and a spec override that
leaves `restricted` (root) is refused by pod admission: the ReplicaSet reports FailedCreate, no
pod exists, and the InferenceService is Degraded with that reason.

The operator runs as a process with its least-privilege RBAC, as in test_operator_reconcile.py;
kwok runs the admitted pods on fake GPU nodes.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from infernetes.operator import names
from infernetes.operator.testing import (
    OperatorProcess,
    create_namespace,
    running_operator,
    wait_until,
)

TIMEOUT = 90
ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture(scope="module")
def restricted_ns(cluster: Any) -> Iterator[str]:
    name = create_namespace(
        cluster, "e2e-restricted", {ENFORCE: "restricted", f"{ENFORCE}-version": "latest"}
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(
    cluster: Any, restricted_ns: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, restricted_ns, tmp_path_factory.mktemp("operator")) as process:
        yield process


def isvc(name: str, **spec: Any) -> dict:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name},
        "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", **spec},
    }


def items(cluster: Any, ns: str, kind: str, *selector: str) -> list[dict]:
    return cluster.kubectl_json("get", kind, "-n", ns, *selector)["items"]


def pods_of(cluster: Any, ns: str, name: str) -> list[dict]:
    return items(cluster, ns, "pods", "-l", f"{names.LABEL_INSTANCE}={name}")


def failed_creates(cluster: Any, ns: str, name: str) -> list[str]:
    """Messages of the FailedCreate events of the ReplicaSets of `name`'s Deployment."""
    replica_sets = {
        rs["metadata"]["name"]
        for rs in items(cluster, ns, "replicasets", "-l", f"{names.LABEL_INSTANCE}={name}")
    }
    events = items(cluster, ns, "events", "--field-selector", "reason=FailedCreate")
    return [
        event["message"]
        for event in events
        if event["involvedObject"]["kind"] == "ReplicaSet"
        and event["involvedObject"]["name"] in replica_sets
    ]


def test_namespace_enforces_restricted(cluster: Any, restricted_ns: str) -> None:
    """The control: a pod without the securityContext the operator renders is refused here."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare", "namespace": restricted_ns},
        "spec": {"containers": [{"name": "c", "image": names.DEFAULT_IMAGE}]},
    }
    result = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in result.stderr


def test_rendered_pods_are_admitted(
    cluster: Any, restricted_ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("hardened"), namespace=restricted_ns)
    pods = wait_until(
        lambda: pods_of(cluster, restricted_ns, "hardened"),
        timeout=TIMEOUT,
        what="the pod of hardened",
    )
    assert failed_creates(cluster, restricted_ns, "hardened") == []
    spec = pods[0]["spec"]
    assert spec["securityContext"]["runAsUser"] == names.RUNTIME_UID
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    def ready() -> bool:
        resource = cluster.kubectl_json("get", "infsvc", "hardened", "-n", restricted_ns)
        conditions = (resource.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_until(ready, timeout=TIMEOUT, what="hardened Ready")


def test_root_override_is_refused_by_pod_admission(
    cluster: Any, restricted_ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        isvc(
            "as-root",
            podSecurityContext={"runAsUser": 0, "runAsNonRoot": False},
            imagePullSecrets=[{"name": "registry"}],
        ),
        namespace=restricted_ns,
    )
    rendered = wait_until(
        lambda: next(
            (
                d
                for d in items(cluster, restricted_ns, "deployments")
                if d["metadata"]["name"] == "as-root"
            ),
            None,
        ),
        timeout=TIMEOUT,
        what="the Deployment of as-root",
    )
    pod_spec = rendered["spec"]["template"]["spec"]
    assert pod_spec["securityContext"]["runAsUser"] == 0
    assert pod_spec["imagePullSecrets"] == [{"name": "registry"}]
    messages = wait_until(
        lambda: failed_creates(cluster, restricted_ns, "as-root"),
        timeout=TIMEOUT,
        what="a FailedCreate event of as-root's ReplicaSet",
    )
    assert any('violates PodSecurity "restricted:latest"' in m for m in messages), messages
    assert any("runAsUser=0" in m for m in messages), messages
    assert pods_of(cluster, restricted_ns, "as-root") == []

    def degraded() -> dict | None:
        resource = cluster.kubectl_json("get", "infsvc", "as-root", "-n", restricted_ns)
        conditions = (resource.get("status") or {}).get("conditions") or []
        found = [c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"]
        return found[0] if found else None

    # The user sees why: the Deployment's ReplicaFailure becomes the resource's Degraded.
    condition = wait_until(degraded, timeout=TIMEOUT, what="as-root Degraded")
    assert condition["reason"] == "FailedCreate"
    assert "PodSecurity" in condition["message"]
