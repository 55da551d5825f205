"""Pods that serve (issue 39, item 3): an InferenceService on the local control plane whose pods
really run, on serving nodes (podkubelet: cluster/serving_nodes.py, cluster/README.md).

Two replicas of a tiny model on the CPU, its weights on a hostPath PersistentVolume given as
`pvc://`: each pod starts the rendered `infernetes serve` command in a network namespace of its
own, becomes Ready from its real startup and readiness probes, answers at its own pod IP, and
the Service's EndpointSlice holds those addresses. The endpoint picker the operator renders for
spec.routing runs as the real binary (the Inference Extension's cmd/epp, cluster/epp.sh) against
the InferencePool, and a request it routes, asked as Envoy asks (ext-proc), reaches an engine. A
killed engine is a container exit the operator reports as a crash loop, then a restart; a
deleted pod's process and netns go.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from infernetes.operator.testing import (
    free_port,
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)
from serving_nodes import (
    POD_NETWORK_PREFIX,
    pod_ready,
    serving_pods,
    serving_spec,
)

NAME = "tiny"
PROMPT = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12]
# Two engines starting on two busy cores.
STARTUP_TIMEOUT = 240


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-serving") as name:
        yield name


@pytest.fixture(scope="module")
def picker_binaries() -> tuple[Path, Path]:
    """(epp, epp-pick), built by cluster/epp.sh."""
    script = Path(__file__).resolve().parents[1] / "cluster" / "epp.sh"
    result = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode == 3:
        pytest.skip("no Go toolchain to build the endpoint picker")
    assert result.returncode == 0, f"{script} failed"
    epp = Path(result.stdout.strip().splitlines()[-1])
    return epp, epp.with_name("epp-pick")


@pytest.fixture(scope="module")
def service(
    cluster: Any,
    ns: str,
    extension_crds: None,
    model_claim: str,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator")):
        cluster.apply(
            {
                "apiVersion": "infernetes.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": NAME, "namespace": ns},
                "spec": serving_spec(
                    f"pvc://{model_claim}/{model_dir.name}",
                    NAME,
                    engine={"maxModelLen": 256, "maxNumSeqs": 2},
                    cpu="1",
                    replicas=2,
                    routing={},
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
            print(cluster.kubectl("get", "pods", "-n", ns, "-o", "yaml", check=False).stdout)
            raise
        yield kubectl_get(cluster, ns, "infsvc", NAME)


def engine_pid(pod: dict) -> int:
    """The container's process: podkubelet reports it as the container id."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    return int(container_id.removeprefix("podkubelet://"))


def greedy_tokens(address: str) -> list[int]:
    response = httpx.post(
        f"http://{address}:8000/v1/completions",
        json={
            "model": NAME,
            "prompt": PROMPT,
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": 1,
            "ignore_eos": True,
            "return_tokens_as_token_ids": True,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    tokens = response.json()["choices"][0]["logprobs"]["tokens"]
    return [int(t.removeprefix("token_id:")) for t in tokens]


def endpoint_addresses(cluster: Any, ns: str) -> set[str]:
    slices = kubectl_get(cluster, ns, "endpointslices", "-l", f"kubernetes.io/service-name={NAME}")[
        "items"
    ]
    return {
        address
        for item in slices
        for endpoint in item.get("endpoints") or ()
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


def test_replicas_serve_at_their_pod_ips_behind_the_service(
    cluster: Any, ns: str, serving_nodes: list[str], service: dict, model_dir: Path
) -> None:
    from infernetes.runtime.testing import hf_greedy_tokens

    running = serving_pods(cluster, ns, NAME)
    assert len(running) == 2 and all(pod_ready(p) for p in running)
    assert {p["spec"]["nodeName"] for p in running} <= set(serving_nodes)
    ips = {p["status"]["podIP"] for p in running}
    assert len(ips) == 2
    assert all(
        ipaddress.ip_address(ip) in ipaddress.ip_network(f"{POD_NETWORK_PREFIX}.0.0/16")
        for ip in ips
    )
    expected = hf_greedy_tokens(model_dir, PROMPT, 6)
    for ip in ips:
        assert greedy_tokens(ip) == expected
    # The controller-manager's EndpointSlices hold the real addresses: a client of the Service
    # (no kube-proxy here, so through its endpoints) reaches an engine.
    addresses = wait_until(
        lambda: endpoint_addresses(cluster, ns) == ips and ips, timeout=30, what="endpoints"
    )
    assert greedy_tokens(sorted(addresses)[0]) == expected


def test_a_killed_engine_is_a_container_exit_and_a_restart(
    cluster: Any, ns: str, service: dict
) -> None:
    pod = serving_pods(cluster, ns, NAME)[0]
    name = pod["metadata"]["name"]
    os.kill(engine_pid(pod), signal.SIGKILL)

    def crashed() -> Any:
        status = kubectl_get(cluster, ns, "pod", name)["status"]["containerStatuses"][0]
        terminated = (status.get("lastState") or {}).get("terminated") or {}
        return status if terminated.get("exitCode") == 137 else None

    status = wait_until(crashed, timeout=30, what=f"{name}'s exit in its status")
    assert (
        status["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff"
        or status["restartCount"] == 1
    )
    degraded = wait_until(
        lambda: (
            (c := service_condition(cluster, ns, NAME, "Degraded")).get("status") == "True" and c
        ),
        timeout=30,
        what="Degraded while the container backs off",
    )
    assert degraded["reason"] == "CrashLoopBackOff"
    assert f"pod {name}" in degraded["message"] and "exit code 137" in degraded["message"]

    def serving_again() -> Any:
        again = kubectl_get(cluster, ns, "pod", name)
        restarted = again["status"]["containerStatuses"][0]["restartCount"] == 1
        return again if restarted and pod_ready(again) else None

    again = wait_until(serving_again, timeout=STARTUP_TIMEOUT, what=f"{name} restarted and Ready")
    assert engine_pid(again) != engine_pid(pod)
    wait_until(
        lambda: service_condition(cluster, ns, NAME, "Degraded").get("status") == "False",
        timeout=60,
        what="Degraded False again",
    )


def test_a_deleted_pod_stops_its_process_and_frees_its_netns(
    cluster: Any, ns: str, service: dict
) -> None:
    pod = serving_pods(cluster, ns, NAME)[0]
    pid = engine_pid(pod)
    netns = subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert netns
    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", ns, "--timeout=90s")
    # podkubelet reaps its children: a stopped process leaves no zombie behind.
    assert not Path(f"/proc/{pid}").exists()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert netns not in listed.stdout.split()


def test_the_endpoint_picker_routes_a_request_to_a_serving_pod(
    cluster: Any,
    ns: str,
    service: dict,
    picker_binaries: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    epp, epp_pick = picker_binaries
    wait_until(lambda: kubectl_get(cluster, ns, "inferencepool", NAME), timeout=30, what="the pool")
    rendered = kubectl_get(cluster, ns, "deployment", f"{NAME}-epp")["spec"]["template"]["spec"]
    container = rendered["containers"][0]
    grpc, health, metrics = free_port(), free_port(), free_port()
    # The rendered command line, run on the host: only the listening ports and the API server's
    # address (KUBECONFIG, where the pod would use its service account) are the host's.
    args = [
        *container["args"],
        f"--grpc-port={grpc}",
        f"--grpc-health-port={health}",
        f"--metrics-port={metrics}",
    ]
    env = {
        **os.environ,
        "NAMESPACE": ns,
        "POD_NAME": f"{NAME}-epp-local",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    log = tmp_path / "epp.log"
    with log.open("w") as out:
        picker = subprocess.Popen([str(epp), *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    ips = {p["status"]["podIP"] for p in serving_pods(cluster, ns, NAME)}
    body = json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0})

    def picked() -> str | None:
        assert picker.poll() is None, f"the picker exited:\n{log.read_text()[-4000:]}"
        answer = subprocess.run(
            [str(epp_pick), f"--addr=127.0.0.1:{grpc}", f"--body={body}", "--timeout=5s"],
            capture_output=True,
            text=True,
            check=False,
        )
        return answer.stdout.strip() if answer.returncode == 0 else None

    try:
        endpoint = wait_until(picked, timeout=60, what="the picker to pick an endpoint")
        host, port = endpoint.rsplit(":", 1)
        assert host in ips and port == "8000", (endpoint, ips)
        response = httpx.post(
            f"http://{endpoint}/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"]
    except BaseException:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        picker.terminate()
        picker.wait(timeout=30)
