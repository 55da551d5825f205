"""A pod larger than any node (issue 15, item 5): on the local control plane's 8-GPU nodes a
tensor-parallel size of 16 in one pod (spec.gpu.perNode 16) gets a Degraded condition naming the
GPUs it needs and the largest node, and no Deployment whose pod would stay Pending; 8 fits and is
rendered. (Without gpu.perNode, 16 spans two nodes: test_operator_multinode.py.)"""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from infernetes.operator.testing import (
    OperatorProcess,
    kubectl_get,
    running_operator,
    wait_until,
)

TIMEOUT = 90


@pytest.fixture
def ns(cluster: Any) -> Iterator[str]:
    name = f"e2e-node-fit-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    # Waited for: the 8-GPU pod must not hold its GPUs into the next modules' tests.
    cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False)


@pytest.fixture
def operator(cluster: Any, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    with running_operator(cluster, ns, tmp_path) as process:
        yield process


def degraded(cluster: Any, ns: str, name: str) -> dict | None:
    status = (kubectl_get(cluster, ns, "infsvc", name) or {}).get("status") or {}
    found = [c for c in status.get("conditions") or () if c["type"] == "Degraded"]
    return found[0] if found and found[0]["status"] == "True" else None


def test_a_replica_larger_than_any_node_is_a_condition_not_a_pending_pod(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    resource = {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "huge"},
        "spec": {
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "gpu": {"perNode": 16},
            "engine": {"tensorParallelSize": 16},
        },
    }
    cluster.apply(resource, namespace=ns)
    condition = wait_until(
        lambda: degraded(cluster, ns, "huge"), timeout=TIMEOUT, what="Degraded for a 16-GPU replica"
    )
    assert condition["reason"] == "TooLargeForAnyNode"
    assert "needs 16 nvidia.com/gpu" in condition["message"]
    assert "largest node has 8" in condition["message"]
    assert kubectl_get(cluster, ns, "deployment", "huge") is None

    cluster.kubectl(
        "patch",
        "infsvc",
        "huge",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"engine":{"tensorParallelSize":8}}}',
    )
    deployment = wait_until(
        lambda: kubectl_get(cluster, ns, "deployment", "huge"),
        timeout=TIMEOUT,
        what="the Deployment",
    )
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == 8
