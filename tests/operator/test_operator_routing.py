"""spec.routing: the InferencePool and its endpoint picker when the Gateway API Inference
Extension's API is served, the Routing condition either way, the CRD's fields and the RBAC the
operator needs to create the picker's Role (the e2e module proves the API server accepts them)."""

from typing import Any

from infernetes.operator.crd import build_crd
from infernetes.operator.discovery import OPTIONAL_GROUP_VERSIONS
from infernetes.operator.drift import differences
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.handlers import CHILD_RESOURCES
from infernetes.operator.rbac import CHILD_VERBS, cluster_rules
from infernetes.operator.render import plan
from infernetes.operator.render.inference_pool import DEFAULT_EPP_IMAGE, PICKER_METRICS

SERVED = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])


def spec(**routing: Any) -> dict[str, Any]:
    return {"model": "org/model", "servedModelName": "chat", "routing": routing}


def by_kind(manifests: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for manifest in manifests:
        found.setdefault(manifest["kind"], []).append(manifest)
    return found


def test_no_routing_no_pool_and_no_condition() -> None:
    result = plan({"model": "org/model"}, SERVED, name="svc", namespace="ns")
    assert [m["kind"] for m in result.manifests] == ["Deployment", "Service"]
    assert "Routing" not in result.conditions


def test_pool_selects_the_serving_pods_and_names_its_picker() -> None:
    result = plan(spec(failureMode="FailOpen"), SERVED, name="svc", namespace="ns", uid="u-1")
    kinds = by_kind(result.manifests)
    (pool,) = kinds["InferencePool"]
    service = kinds["Service"][0]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "svc-epp",
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }
    # Every child is owned by the InferenceService (deleted with it) and watched by its labels.
    for manifest in result.manifests:
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert manifest["metadata"]["labels"]["app.kubernetes.io/instance"] == "svc"
    assert result.conditions["Routing"][:2] == ("True", "InferencePool")


def test_picker_reads_the_pool_and_vllm_metrics_and_its_pods_stay_apart() -> None:
    result = plan(spec(), SERVED, name="svc", namespace="ns")
    kinds = by_kind(result.manifests)
    server, picker = kinds["Deployment"]
    assert picker["metadata"]["name"] == "svc-epp"
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    assert container["image"] == DEFAULT_EPP_IMAGE
    args = container["args"]
    assert {
        "--pool-name=svc",
        "--pool-namespace=ns",
        "--pool-group=inference.networking.k8s.io",
    } <= set(args)
    # The extension's v1.5.0 picker reads vLLM's names by default and has no flags for them.
    assert not any(arg.startswith(flag) for arg in args for flag in PICKER_METRICS)
    # The picker's pods are neither the Service's nor counted in the InferenceService's status.
    picker_labels = picker["spec"]["template"]["metadata"]["labels"]
    served = kinds["Service"][0]["spec"]["selector"]
    assert not served.items() <= picker_labels.items()
    assert "app.kubernetes.io/instance" not in picker_labels
    assert server["spec"]["template"]["metadata"]["labels"].items() >= served.items()
    (picker_service,) = [s for s in kinds["Service"] if s["metadata"]["name"] == "svc-epp"]
    assert picker_service["spec"]["selector"] == picker_labels
    assert picker["spec"]["template"]["spec"]["serviceAccountName"] == "svc-epp"
    (role,) = kinds["Role"]
    assert {"inferencepools", "pods", "inferenceobjectives", "inferencemodelrewrites"} == {
        resource for rule in role["rules"] for resource in rule["resources"]
    }
    assert kinds["RoleBinding"][0]["subjects"][0]["name"] == "svc-epp"


def test_picker_image_and_resources_from_the_spec() -> None:
    picker = {"image": "example.com/epp:dev", "resources": {"requests": {"cpu": "1"}}}
    result = plan(spec(endpointPicker=picker), SERVED, name="svc", namespace="ns")
    (deployment,) = [
        m
        for m in result.manifests
        if m["metadata"]["name"] == "svc-epp" and m["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/epp:dev"
    assert container["resources"] == {"requests": {"cpu": "1"}}


def test_multi_node_pool_selects_the_leaders_only() -> None:
    facts = ClusterFacts.from_api_versions(
        ["inference.networking.k8s.io/v1", "leaderworkerset.x-k8s.io/v1"]
    )
    facts = ClusterFacts(apis=facts.apis, gpus_per_node={"nvidia.com/gpu": 8})
    body = {**spec(), "engine": {"tensorParallelSize": 16}, "gpu": {"count": 16}}
    result = plan(body, facts, name="svc", namespace="ns")
    (pool,) = [m for m in result.manifests if m["kind"] == "InferencePool"]
    assert pool["spec"]["selector"]["matchLabels"]["infernetes.io/role"] == "leader"


def test_without_the_extension_the_condition_says_so_and_nothing_is_rendered() -> None:
    result = plan(spec(), ClusterFacts(), name="svc", namespace="ns")
    assert [m["kind"] for m in result.manifests] == ["Deployment", "Service"]
    status, reason, message = result.conditions["Routing"]
    assert (status, reason) == ("False", "InferencePoolMissing")
    assert "inference.networking.k8s.io/v1" in message


def test_crd_documents_routing_and_refuses_unknown_failure_modes() -> None:
    crd = build_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    routing = schema["properties"]["routing"]
    assert routing["description"]
    assert routing["properties"]["failureMode"]["enum"] == ["FailClose", "FailOpen"]
    picker = routing["properties"]["endpointPicker"]
    assert picker["description"] and picker["properties"]["image"]["description"]


def test_operator_may_create_the_pool_and_grant_what_the_picker_reads() -> None:
    rules = cluster_rules()

    def verbs(group: str, resource: str) -> set[str]:
        return {
            verb
            for rule in rules
            if group in rule["apiGroups"] and resource in rule.get("resources", ())
            for verb in rule["verbs"]
        }

    assert verbs("inference.networking.k8s.io", "inferencepools") >= set(CHILD_VERBS)
    for resource in ("roles", "rolebindings"):
        assert verbs("rbac.authorization.k8s.io", resource) >= set(CHILD_VERBS)
    assert verbs("", "serviceaccounts") >= set(CHILD_VERBS)
    # A Role may grant only what its creator holds.
    assert verbs("inference.networking.x-k8s.io", "inferenceobjectives") >= {"get", "list", "watch"}
    assert verbs("", "pods") >= {"get", "list", "watch"}


ROUTED = ClusterFacts.from_api_versions(
    ["inference.networking.k8s.io/v1", "gateway.networking.k8s.io/v1"]
)
GATEWAY = {"refs": [{"name": "inference-gateway"}]}


def test_gateway_refs_render_an_http_route_to_the_pool() -> None:
    gateway = {
        "refs": [
            {"name": "inference-gateway"},
            {"name": "shared", "namespace": "gateways", "sectionName": "https"},
        ],
        "requestTimeout": "10m",
    }
    result = plan(spec(gateway=gateway), ROUTED, name="svc", namespace="ns", uid="u-1")
    (route,) = by_kind(result.manifests)["HTTPRoute"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["name"] == "svc"
    assert route["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert route["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "infernetes"
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"},
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "shared",
            "namespace": "gateways",
            "sectionName": "https",
        },
    ]
    (rule,) = route["spec"]["rules"]
    (pool,) = by_kind(result.manifests)["InferencePool"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "svc"}
    ]
    assert pool["metadata"]["name"] == "svc"
    assert rule["timeouts"] == {"request": "10m"}
    status, reason, message = result.conditions["Routing"]
    assert (status, reason) == ("True", "HTTPRoute")
    assert "ns/inference-gateway" in message and "gateways/shared (https)" in message


def test_route_timeout_defaults_to_the_extensions_300s() -> None:
    result = plan(spec(gateway=GATEWAY), ROUTED, name="svc", namespace="ns")
    (route,) = by_kind(result.manifests)["HTTPRoute"]
    assert route["spec"]["rules"][0]["timeouts"] == {"request": "300s"}


def test_without_gateway_refs_no_route() -> None:
    result = plan(spec(), ROUTED, name="svc", namespace="ns")
    assert "HTTPRoute" not in by_kind(result.manifests)
    assert result.conditions["Routing"][:2] == ("True", "InferencePool")


def test_without_the_gateway_api_the_pool_stays_and_the_condition_names_the_route() -> None:
    result = plan(spec(gateway=GATEWAY), SERVED, name="svc", namespace="ns")
    kinds = by_kind(result.manifests)
    assert "HTTPRoute" not in kinds and "InferencePool" in kinds
    status, reason, message = result.conditions["Routing"]
    assert (status, reason) == ("False", "HTTPRouteMissing")
    assert "gateway.networking.k8s.io/v1 HTTPRoute" in message


def test_without_the_pool_api_there_is_no_route_either() -> None:
    facts = ClusterFacts.from_api_versions(["gateway.networking.k8s.io/v1"])
    result = plan(spec(gateway=GATEWAY), facts, name="svc", namespace="ns")
    assert [m["kind"] for m in result.manifests] == ["Deployment", "Service"]
    assert result.conditions["Routing"][1] == "InferencePoolMissing"


def test_crd_types_and_documents_the_gateway_refs() -> None:
    crd = build_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    gateway = schema["properties"]["routing"]["properties"]["gateway"]
    assert gateway["required"] == ["refs"] and gateway["description"]
    refs = gateway["properties"]["refs"]
    assert refs["minItems"] == 1 and refs["maxItems"] == 32
    ref = refs["items"]
    assert ref["required"] == ["name"]
    for field in ("name", "namespace", "sectionName"):
        assert ref["properties"][field]["description"] and ref["properties"][field]["pattern"]
    timeout = gateway["properties"]["requestTimeout"]
    assert timeout["default"] == "300s" and timeout["pattern"]


def test_operator_may_manage_http_routes() -> None:
    rules = cluster_rules()
    verbs = {
        verb
        for rule in rules
        if "gateway.networking.k8s.io" in rule["apiGroups"] and "httproutes" in rule["resources"]
        for verb in rule["verbs"]
    }
    assert verbs >= set(CHILD_VERBS)


def test_the_gateway_api_is_discovered_and_its_routes_watched() -> None:
    assert "gateway.networking.k8s.io/v1" in OPTIONAL_GROUP_VERSIONS
    assert ("gateway.networking.k8s.io", "v1", "httproutes") in CHILD_RESOURCES
    assert ROUTED.serves("gateway.networking.k8s.io/v1", "HTTPRoute")


def test_parent_refs_of_one_name_in_two_namespaces_compare_as_a_whole() -> None:
    gateway = {"refs": [{"name": "gw", "namespace": "a"}, {"name": "gw", "namespace": "b"}]}
    (route,) = by_kind(plan(spec(gateway=gateway), ROUTED, name="svc", namespace="ns").manifests)[
        "HTTPRoute"
    ]
    assert differences(route, route) == []
    swapped = {**route, "spec": {**route["spec"], "parentRefs": route["spec"]["parentRefs"][::-1]}}
    assert differences(route, swapped) != []
