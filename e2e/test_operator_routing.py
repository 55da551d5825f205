"""spec.routing on the local control plane (issue 21, part 3): without the Gateway API Inference
Extension's CRDs the Routing condition says so and the Service serves alone; once the CRDs are
installed (from the extension's Go module, cluster/inference-extension-crds.sh) the operator
discovers them and creates an InferencePool the API server validates against the extension's own
schema, with the endpoint picker's Deployment, Service, ServiceAccount, Role and RoleBinding (the
operator's least-privilege RBAC must hold what that Role grants); turning routing off deletes
them, and deleting the InferenceService lets the garbage collector take them (owner references).
"""

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    REPO,
    OperatorProcess,
    create_namespace,
    kubectl_get,
    service_condition,
    start_operator,
    wait_until,
)

TIMEOUT = 90
PICKER = [
    ("deployment", "epp"),
    ("service", "epp"),
    ("serviceaccount", "epp"),
    ("role", "epp"),
    ("rolebinding", "epp"),
]


def extension_crds() -> list[dict]:
    out = subprocess.run(
        [str(REPO / "cluster" / "inference-extension-crds.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    directory = Path(out.strip().splitlines()[-1])
    # The v1 InferencePool (inference.networking.k8s.io) is what the operator renders.
    paths = sorted(directory.glob("inference.networking.k8s.io_*.yaml"))
    return [yaml.safe_load(path.read_text()) for path in paths]


def remove_extension(cluster: Any, crds: list[dict], wait: bool = True) -> None:
    names = [crd["metadata"]["name"] for crd in crds]
    cluster.kubectl("delete", "crd", *names, "--ignore-not-found", f"--wait={str(wait).lower()}")


@pytest.fixture(scope="module")
def crds(cluster: Any) -> Iterator[list[dict]]:
    found = extension_crds()
    remove_extension(cluster, found)  # start without the extension whatever ran before
    yield found
    remove_extension(cluster, found, wait=False)


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    name = create_namespace(cluster, "e2e-routing")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, crds: list[dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = start_operator(cluster, ns, tmp_path_factory.mktemp("operator-routing"))
    yield process
    process.stop()
    print(f"operator log: {process.log_path}")


def apply(cluster: Any, ns: str, manifest: dict) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))


def routed(name: str, routing: dict | None) -> dict:
    spec: dict[str, Any] = {"model": "tiny/model", "engine": {"device": "cpu"}}
    if routing is not None:
        spec["routing"] = routing
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def picker_objects(cluster: Any, ns: str, name: str) -> list[Any]:
    return [kubectl_get(cluster, ns, kind, f"{name}-{suffix}") for kind, suffix in PICKER]


def test_pool_appears_with_the_extension_and_goes_with_routing_and_the_service(
    cluster: Any, ns: str, crds: list[dict], operator: OperatorProcess
) -> None:
    apply(cluster, ns, routed("chat", {"endpointPicker": {"image": "example.com/epp:test"}}))
    wait_until(
        lambda: (
            service_condition(cluster, ns, "chat", "Routing").get("reason")
            == "InferencePoolMissing"
        ),
        timeout=TIMEOUT,
        what="Routing False without the extension's CRDs",
    )
    assert kubectl_get(cluster, ns, "service", "chat") is not None

    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    for crd in crds:
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}"
        )
    wait_until(
        lambda: kubectl_get(cluster, ns, "inferencepool", "chat") is not None,
        timeout=TIMEOUT,
        what="the InferencePool once the extension's API is served",
    )
    pool = kubectl_get(cluster, ns, "inferencepool", "chat")
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "chat-epp"
    service = kubectl_get(cluster, ns, "service", "chat")
    assert pool["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    wait_until(
        lambda: all(picker_objects(cluster, ns, "chat")),
        timeout=TIMEOUT,
        what="the endpoint picker's objects",
    )
    picker = kubectl_get(cluster, ns, "deployment", "chat-epp")
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/epp:test"
    assert "--pool-name=chat" in container["args"]
    wait_until(
        lambda: service_condition(cluster, ns, "chat", "Routing").get("status") == "True",
        timeout=TIMEOUT,
        what="Routing True",
    )

    apply(cluster, ns, routed("chat", None))  # routing off
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "inferencepool", "chat") is None
            and not any(picker_objects(cluster, ns, "chat"))
        ),
        timeout=TIMEOUT,
        what="the pool and the picker deleted once routing is off",
    )
    assert kubectl_get(cluster, ns, "service", "chat") is not None
    wait_until(
        lambda: service_condition(cluster, ns, "chat", "Routing") == {},
        timeout=TIMEOUT,
        what="no Routing condition without spec.routing",
    )

    apply(cluster, ns, routed("chat", {}))
    wait_until(
        lambda: kubectl_get(cluster, ns, "inferencepool", "chat") is not None,
        timeout=TIMEOUT,
        what="the pool again",
    )
    owner = kubectl_get(cluster, ns, "inferencepool", "chat")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("InferenceService", "chat")
    cluster.kubectl("delete", "infsvc", "chat", "-n", ns, "--wait=true", "--timeout=60s")
    wait_until(
        lambda: (
            kubectl_get(cluster, ns, "inferencepool", "chat") is None
            and not any(picker_objects(cluster, ns, "chat"))
        ),
        timeout=TIMEOUT,
        what="the garbage collector to delete the pool and the picker with the service",
    )
