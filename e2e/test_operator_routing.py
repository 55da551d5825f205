"""spec.routing on the local control plane (issue 21, part 3): without the Gateway API Inference
Extension's CRDs the Routing condition says so and the Service serves alone; once the CRDs are
installed (from the extension's Go module, cluster/go-module-crds.sh) the operator
discovers them and creates an InferencePool the API server validates against the extension's own
schema, with the endpoint picker's Deployment, Service, ServiceAccount, Role and RoleBinding (the
operator's least-privilege RBAC must hold what that Role grants); turning routing off deletes
them, and deleting the InferenceService lets the garbage collector take them (owner references).
With spec.routing.gateway, the HTTPRoute from the Gateway to the pool waits for the Gateway API's
CRDs (its Go module, standard channel), is then valid to the API server against their schema,
names the pool as its backend, is repaired when edited or deleted, and goes with the gateway
refs or the service; bad refs are refused at admission naming the field.
"""

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    OperatorProcess,
    apply_crds,
    go_module_crds,
    kubectl_get,
    remove_crds,
    running_operator,
    service_condition,
    temporary_namespace,
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
    # The v1 InferencePool (inference.networking.k8s.io) is what the operator renders.
    return go_module_crds(
        "sigs.k8s.io/gateway-api-inference-extension",
        "INFERENCE_EXTENSION_VERSION",
        "config/crd/bases/inference.networking.k8s.io_*.yaml",
    )


def gateway_api_crds() -> list[dict]:
    return go_module_crds(
        "sigs.k8s.io/gateway-api", "GATEWAY_API_VERSION", "config/crd/standard/*.yaml"
    )


@pytest.fixture(scope="module")
def crds(cluster: Any) -> Iterator[list[dict]]:
    found = extension_crds()
    remove_crds(cluster, found)  # start without the extension whatever ran before
    yield found
    remove_crds(cluster, found, wait=False)


@pytest.fixture(scope="module")
def gateway_crds(cluster: Any) -> Iterator[list[dict]]:
    found = gateway_api_crds()
    remove_crds(cluster, found)
    yield found
    remove_crds(cluster, found, wait=False)


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-routing") as name:
        yield name


@pytest.fixture(scope="module")
def operator(
    cluster: Any,
    ns: str,
    crds: list[dict],
    gateway_crds: list[dict],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator-routing")) as process:
        yield process


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

    apply_crds(cluster, crds)
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


def test_http_route_from_the_gateway_to_the_pool_once_the_gateway_api_is_served(
    cluster: Any,
    ns: str,
    crds: list[dict],
    gateway_crds: list[dict],
    operator: OperatorProcess,
) -> None:
    apply_crds(cluster, crds)  # the extension is served (the test above may have run or not)
    gateway = {"refs": [{"name": "inference-gateway"}], "requestTimeout": "10m"}
    apply(cluster, ns, routed("web", {"gateway": gateway}))
    wait_until(
        lambda: (
            service_condition(cluster, ns, "web", "Routing").get("reason") == "HTTPRouteMissing"
        ),
        timeout=TIMEOUT,
        what="Routing False (HTTPRouteMissing) without the Gateway API's CRDs",
    )
    assert kubectl_get(cluster, ns, "inferencepool", "web") is not None

    apply_crds(cluster, gateway_crds)
    wait_until(
        lambda: kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web"),
        timeout=TIMEOUT,
        what="the HTTPRoute once the Gateway API is served",
    )
    route = kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web")
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["kind"], parent["name"]) == ("Gateway", "inference-gateway")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        "web",
    )
    assert rule["timeouts"]["request"] == "10m"
    owner = route["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("InferenceService", "web")
    wait_until(
        lambda: service_condition(cluster, ns, "web", "Routing").get("reason") == "HTTPRoute",
        timeout=TIMEOUT,
        what="Routing True (HTTPRoute)",
    )

    # Drift: an edit is put back, a deletion undone.
    cluster.kubectl(
        "patch",
        "httproute.gateway.networking.k8s.io",
        "web",
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op": "replace", "path": "/spec/rules/0/backendRefs/0/name", "value": "other"}]',
    )
    wait_until(
        lambda: (
            (kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web") or {})
            .get("spec", {})
            .get("rules", [{}])[0]
            .get("backendRefs", [{}])[0]
            .get("name")
            == "web"
        ),
        timeout=TIMEOUT,
        what="the edited backendRef repaired",
    )
    uid = kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web")["metadata"]["uid"]
    cluster.kubectl("delete", "httproute.gateway.networking.k8s.io", "web", "-n", ns)
    wait_until(
        lambda: (
            (kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web") or {})
            .get("metadata", {})
            .get("uid", uid)
            != uid
        ),
        timeout=TIMEOUT,
        what="the deleted HTTPRoute recreated",
    )

    apply(cluster, ns, routed("web", {}))  # routing on, no gateway
    wait_until(
        lambda: kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web") is None,
        timeout=TIMEOUT,
        what="the HTTPRoute deleted once routing.gateway is gone",
    )
    assert kubectl_get(cluster, ns, "inferencepool", "web") is not None

    apply(cluster, ns, routed("web", {"gateway": gateway}))
    wait_until(
        lambda: kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web"),
        timeout=TIMEOUT,
        what="the HTTPRoute again",
    )
    cluster.kubectl("delete", "infsvc", "web", "-n", ns, "--wait=true", "--timeout=60s")
    wait_until(
        lambda: kubectl_get(cluster, ns, "httproute.gateway.networking.k8s.io", "web") is None,
        timeout=TIMEOUT,
        what="the garbage collector to delete the HTTPRoute with the service",
    )


@pytest.mark.parametrize(
    ("gateway", "field", "message"),
    [
        ({"refs": []}, "spec.routing.gateway.refs", "at least 1"),
        ({}, "spec.routing.gateway.refs", "Required value"),
        ({"refs": [{"name": "Not_A_Name"}]}, "spec.routing.gateway.refs[0].name", "should match"),
        (
            {"refs": [{"name": "gw"}], "requestTimeout": "5 minutes"},
            "spec.routing.gateway.requestTimeout",
            "should match",
        ),
    ],
)
def test_admission_refuses_bad_gateway_refs_naming_the_field(
    cluster: Any, ns: str, gateway: dict, field: str, message: str
) -> None:
    result = cluster.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        input=yaml.safe_dump(routed("bad-gateway", {"gateway": gateway})),
        check=False,
    )
    assert result.returncode != 0
    assert field in result.stderr and message in result.stderr, result.stderr
