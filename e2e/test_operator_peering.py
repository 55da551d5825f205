"""Several operator replicas coordinate through kopf peering: only the highest priority works,
and another takes over when it leaves."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    OperatorProcess,
    install_crds,
    service_account_kubeconfig,
    wait_until,
)

TIMEOUT = 90


@pytest.fixture
def peering_ns(cluster: Any) -> Iterator[str]:
    name = f"e2e-peering-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def ready(cluster: Any, ns: str, name: str) -> bool:
    result = cluster.kubectl("get", "infsvc", name, "-n", ns, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    conditions = (yaml.safe_load(result.stdout).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def handled(operator: OperatorProcess, name: str) -> bool:
    return any(
        "reconciled " in line and f"/{name} generation" in line
        for line in operator.log().splitlines()
    )


def isvc(name: str) -> dict:
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": "tiny/model", "engine": {"device": "cpu"}},
    }


def test_only_the_highest_priority_replica_works(
    cluster: Any, peering_ns: str, tmp_path: Path
) -> None:
    install_crds(cluster.kubectl)
    kubeconfig = service_account_kubeconfig(
        cluster.kubectl, namespace=peering_ns, path=tmp_path / "kubeconfig"
    )
    cluster.apply(
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "infernetes"}},
        namespace=peering_ns,
    )
    replicas = [
        OperatorProcess(
            kubeconfig=kubeconfig,
            log_path=tmp_path / f"operator-{priority}.log",
            namespaces=[peering_ns],
            extra_args=["--peering=infernetes", f"--priority={priority}"],
            env=cluster.env,
        )
        for priority in (200, 100)
    ]
    high, low = replicas
    try:
        for replica in replicas:
            replica.start()
        # kopf starts every replica paused until the peering object says it is the top one.
        wait_until(
            lambda: "Resuming operations" in high.log(),
            timeout=TIMEOUT,
            what="the top replica to resume",
        )

        cluster.apply(isvc("first"), namespace=peering_ns)
        wait_until(lambda: ready(cluster, peering_ns, "first"), timeout=TIMEOUT, what="first Ready")
        assert handled(high, "first") and not handled(low, "first")
        assert "Resuming operations" not in low.log()

        high.stop()  # a graceful exit leaves the peering, so the other replica resumes at once
        cluster.apply(isvc("second"), namespace=peering_ns)
        wait_until(
            lambda: ready(cluster, peering_ns, "second"), timeout=TIMEOUT, what="second Ready"
        )
        assert handled(low, "second")
    finally:
        for replica in replicas:
            replica.stop()


def test_clusterwide_operator_runs_with_its_rbac(
    cluster: Any, peering_ns: str, tmp_path: Path
) -> None:
    """The default mode (all namespaces), as the chart runs it, needs nothing beyond its ClusterRole."""
    install_crds(cluster.kubectl)
    kubeconfig = service_account_kubeconfig(
        cluster.kubectl, namespace=peering_ns, path=tmp_path / "kubeconfig"
    )
    operator = OperatorProcess(
        kubeconfig=kubeconfig, log_path=tmp_path / "operator.log", env=cluster.env
    )
    try:
        operator.start()
        cluster.apply(isvc("everywhere"), namespace=peering_ns)
        wait_until(lambda: ready(cluster, peering_ns, "everywhere"), timeout=TIMEOUT, what="Ready")
        assert "forbidden" not in operator.log().lower()
    finally:
        operator.stop()
