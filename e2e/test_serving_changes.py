"""Changes that lose no request (issue 38, item 5), on pods that serve (podkubelet nodes).

An InferenceService of three CPU replicas of a tiny model serves 200 streamed completions kept in
flight (cluster/streaming_load.py: the client balances over the Service's ready endpoints, which
it watches as kube-proxy does, and retries nothing) while it is rolled (a new engine flag), one serving node is drained
(`kubectl drain`: cordon, then evictions the PodDisruptionBudget paces) and it is scaled in from
3 replicas to 1. Every stream must end with finish_reason "length" and `[DONE]`, with no HTTP
error: readiness gates a new pod until it serves, a going pod's preStop keeps it serving while
its endpoint goes, and its drain lets the streams in flight finish.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from infernetes.operator.testing import (
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)
from serving_nodes import serving_spec
from streaming_load import StreamingLoad, ready_addresses

NAME = "tiny"
IN_FLIGHT = 200
REPLICAS = 3
# One engine starting on two busy cores while the others serve the load (up to 4 minutes seen on
# the shared machine). A roll starts its pods one after another (a surge of one), and a drain
# replaces the drained node's pods one after another (the PodDisruptionBudget lets one go at a
# time): each waits for that many starts.
STARTUP_TIMEOUT = 300
# A going pod finishes the streams it holds (about 70 of the 200) before it exits. On the shared,
# loaded machine its engine finished 0.8 to 1.5 a second, so the default 60 s grace period (a 40 s
# drain) aborted some: this service's requests take that long, and its grace period says so.
GRACE_SECONDS = 180


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-changes") as name:
        yield name


@pytest.fixture(scope="module")
def service(
    cluster: Any,
    ns: str,
    model_claim: str,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator")):
        cluster.apply(
            {
                "apiVersion": "infernetes.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": NAME, "namespace": ns},
                "spec": serving_spec(
                    f"pvc://{model_claim}/{model_dir.name}",
                    NAME,
                    engine={"maxNumSeqs": 16},
                    cpu="100m",
                    memory="512Mi",
                    replicas=REPLICAS,
                    terminationGracePeriodSeconds=GRACE_SECONDS,
                ),
            }
        )
        try:
            wait_until(
                lambda: service_condition(cluster, ns, NAME, "Ready").get("status") == "True",
                timeout=STARTUP_TIMEOUT,
                what=f"{NAME} Ready",
            )
        except TimeoutError:
            print(cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout)
            raise
        yield


def pods(cluster: Any, ns: str) -> list[dict]:
    return kubectl_get(cluster, ns, "pods", "-l", f"app.kubernetes.io/instance={NAME}")["items"]


def settled(cluster: Any, ns: str, replicas: int, api_client: Any) -> bool:
    """The Deployment has rolled out `replicas` pods, no other pod is left, and the Service's
    endpoints are exactly theirs."""
    deployment = kubectl_get(cluster, ns, "deployment", NAME)
    status = deployment["status"]
    rolled = (
        status.get("observedGeneration") == deployment["metadata"]["generation"]
        and status.get("updatedReplicas") == replicas
        and status.get("readyReplicas") == replicas
        and status.get("replicas") == replicas
    )
    current = pods(cluster, ns)
    ips = {p["status"].get("podIP") for p in current}
    return rolled and len(current) == replicas and set(ready_addresses(api_client, ns, NAME)) == ips


def patch_service(cluster: Any, ns: str, spec: dict) -> None:
    cluster.kubectl(
        "patch", "infsvc", NAME, "-n", ns, "--type=merge", "-p", json.dumps({"spec": spec})
    )


def test_a_roll_a_drain_and_a_scale_in_lose_no_request(
    cluster: Any, ns: str, service: None, api_client: Any, serving_nodes: list[str]
) -> None:
    load = StreamingLoad(api_client, ns, NAME, NAME, concurrency=IN_FLIGHT, max_tokens=12)
    load.start()
    steps: list[str] = []

    def progressed(since: int) -> bool:
        return load.completed() >= since + IN_FLIGHT

    try:
        wait_until(lambda: progressed(0), timeout=120, what="the load to get going")

        # (a) A rolling update: a new engine flag is a new pod template.
        before, began = load.completed(), time.monotonic()
        patch_service(cluster, ns, {"engine": {"maxNumSeqs": 12}})
        wait_until(
            lambda: settled(cluster, ns, REPLICAS, api_client),
            timeout=REPLICAS * STARTUP_TIMEOUT + GRACE_SECONDS,
            what="the roll",
        )
        steps.append(
            f"roll: {load.completed() - before} completed in {time.monotonic() - began:.0f} s"
        )
        for pod in pods(cluster, ns):
            assert "--max-num-seqs=12" in " ".join(pod["spec"]["containers"][0]["args"])

        # (b) A drain of the node with the most pods (evictions, paced by the PDB).
        on_node = [p["spec"]["nodeName"] for p in pods(cluster, ns)]
        node = max(serving_nodes, key=on_node.count)
        # Each eviction waits for a replacement to serve, then for its pod to drain.
        evictions = on_node.count(node) * (STARTUP_TIMEOUT + GRACE_SECONDS)
        before, began = load.completed(), time.monotonic()
        cluster.kubectl(
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            f"--timeout={evictions}s",
            timeout=evictions + 30,
        )
        wait_until(
            lambda: settled(cluster, ns, REPLICAS, api_client),
            timeout=STARTUP_TIMEOUT,
            what="the drain",
        )
        assert all(p["spec"]["nodeName"] != node for p in pods(cluster, ns))
        cluster.kubectl("uncordon", node)
        steps.append(
            f"drain of {node}: {load.completed() - before} completed in {time.monotonic() - began:.0f} s"
        )

        # (c) A scale-in from 3 replicas to 1.
        before, began = load.completed(), time.monotonic()
        patch_service(cluster, ns, {"replicas": 1})
        wait_until(
            lambda: settled(cluster, ns, 1, api_client),
            timeout=GRACE_SECONDS + 60,
            what="the scale-in",
        )
        after = load.completed()
        wait_until(lambda: progressed(after), timeout=120, what="load on one replica")
        steps.append(
            f"scale-in: {load.completed() - before} completed in {time.monotonic() - began:.0f} s"
        )
    finally:
        report = load.stop()
        for node in serving_nodes:
            cluster.kubectl("uncordon", node, check=False)
    print(f"{report.completed} streams completed; " + "; ".join(steps))
    kinds = Counter(lost.problem.split(":")[0] for lost in report.lost)
    assert report.lost == [], f"{len(report.lost)} lost ({dict(kinds)}):\n" + "\n".join(
        map(str, report.lost[:40])
    )
