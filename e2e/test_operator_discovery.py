"""Optional APIs that come and go while the operator runs (issue 20, part 3): the Prometheus
operator's CRDs installed, then removed. The ServiceMonitor follows; the pods never restart; a
reconcile after the removal succeeds."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    MONITORING_CRDS,
    OperatorProcess,
    kubectl_get,
    start_operator,
    wait_until,
)

TIMEOUT = 90
NAMES = [crd["metadata"]["name"] for crd in MONITORING_CRDS]


def install_monitoring(cluster: Any) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(MONITORING_CRDS))
    for name in NAMES:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")


def remove_monitoring(cluster: Any) -> None:
    cluster.kubectl("delete", "crd", *NAMES, "--ignore-not-found", "--wait=true")


@pytest.fixture
def ns(cluster: Any) -> Iterator[str]:
    name = f"e2e-discovery-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(cluster: Any, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = start_operator(cluster, ns, tmp_path)  # installs the monitoring CRDs too
    yield process
    process.stop()
    install_monitoring(cluster)  # as the other modules expect them
    print(f"operator log: {process.log_path}")


def ready_at(cluster: Any, ns: str, name: str, generation: int) -> bool:
    resource = kubectl_get(cluster, ns, "infsvc", name) or {}
    status = resource.get("status") or {}
    ready = [c for c in status.get("conditions") or () if c["type"] == "Ready"]
    return (
        status.get("observedGeneration") == generation
        and bool(ready)
        and ready[0]["status"] == "True"
        and ready[0]["observedGeneration"] == generation
    )


def served(operator: OperatorProcess) -> str | None:
    """What the operator last said it serves of the optional APIs (None before it said)."""
    said = [line for line in operator.log().splitlines() if "optional APIs served: " in line]
    return said[-1].split("optional APIs served: ", 1)[1].strip() if said else None


def monitoring_gone(operator: OperatorProcess) -> bool:
    """The operator's latest word names no monitoring API (others, such as DRA's
    resource.k8s.io, which the API server itself serves, may stay)."""
    latest = served(operator)
    return latest is not None and "monitoring.coreos.com" not in latest


def pods(cluster: Any, ns: str) -> dict[str, int] | None:
    """Restarts by pod uid; None when the listing failed (kubectl's discovery can fail while a
    CRD goes)."""
    listing = kubectl_get(cluster, ns, "pods", "-l", "app.kubernetes.io/instance=watched")
    if listing is None:
        return None
    return {
        p["metadata"]["uid"]: sum(
            s.get("restartCount", 0) for s in p["status"].get("containerStatuses") or ()
        )
        for p in listing["items"]
    }


def test_monitoring_apis_appearing_and_going_never_restart_pods(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    remove_monitoring(cluster)
    # The latest word, not a count: the operator may have said so already at its start, when the
    # API server's discovery had not caught up with the CRDs the fixture installed.
    wait_until(
        lambda: monitoring_gone(operator),
        timeout=TIMEOUT,
        what="the operator to see the monitoring APIs gone",
    )
    resource = {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "watched"},
        "spec": {"model": "tiny/model", "replicas": 2, "engine": {"device": "cpu"}},
    }
    cluster.apply(resource, namespace=ns)

    # Ready needs one ready replica; the ReplicaSet may create the second a moment later.
    def ready_with_both_pods() -> dict[str, int] | None:
        listed = pods(cluster, ns) if ready_at(cluster, ns, "watched", 1) else None
        return listed if listed and len(listed) == 2 else None

    before = wait_until(ready_with_both_pods, timeout=TIMEOUT, what="Ready with both pods")
    template = kubectl_get(cluster, ns, "deployment", "watched")["spec"]["template"]
    assert kubectl_get(cluster, ns, "servicemonitor", "watched") is None

    install_monitoring(cluster)
    monitor = wait_until(
        lambda: kubectl_get(cluster, ns, "servicemonitor", "watched"),
        timeout=TIMEOUT,
        what="a ServiceMonitor once the API is served",
    )
    assert monitor["metadata"]["ownerReferences"][0]["name"] == "watched"

    wait_until(
        lambda: "monitoring.coreos.com" in (served(operator) or ""),
        timeout=TIMEOUT,
        what="the operator to say the monitoring APIs are served",
    )

    remove_monitoring(cluster)
    wait_until(
        lambda: monitoring_gone(operator),
        timeout=TIMEOUT,
        what="the operator to see the monitoring APIs gone again",
    )
    assert kubectl_get(cluster, ns, "deployment", "watched")["spec"]["template"] == template
    # The same pods, never restarted.
    assert wait_until(lambda: pods(cluster, ns), timeout=TIMEOUT, what="the pods") == before

    # A reconcile without the API: no ServiceMonitor to apply, none to look for, no error.
    cluster.kubectl(
        "patch", "infsvc", "watched", "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":3}}'
    )
    wait_until(lambda: ready_at(cluster, ns, "watched", 2), timeout=TIMEOUT, what="generation 2")
    # (kopf's own watchers of the vanished kinds log their 404s; ours log no failure.)
    ours = [line for line in operator.log().splitlines() if "infernetes.operator" in line]
    assert not [line for line in ours if "WARNING" in line or "ERROR" in line], ours
