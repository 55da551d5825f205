"""spec.gpu.deviceClassName / resourceClaimTemplateName: GPUs claimed through Dynamic Resource
Allocation instead of the device plugin's count."""

from infernetes.operator.facts import DRA_GV, ClusterFacts
from infernetes.operator.gpus import pod_gpus
from infernetes.operator.render import SERVER, plan
from infernetes.operator.render.dra import MISSING

DRA = ClusterFacts(apis=frozenset({f"{DRA_GV}/ResourceClaimTemplate"}))
# A node of 4 device-plugin GPUs: a TP 8 replica would otherwise span nodes.
DRA_AND_SMALL_NODES = ClusterFacts(apis=DRA.apis, gpus_per_node={"nvidia.com/gpu": 4})


def rendered(spec: dict, facts: ClusterFacts = DRA) -> tuple[dict, list[dict]]:
    result = plan(spec, facts, name="m", namespace="ns")
    assert result.blocked is None
    templates = [m for m in result.manifests if m["kind"] == "ResourceClaimTemplate"]
    return result.workloads[SERVER]["spec"]["template"]["spec"], templates


def test_a_device_class_renders_a_template_of_the_replicas_gpus_and_a_claim_per_pod() -> None:
    spec = {
        "model": "x",
        "engine": {"tensorParallelSize": 2},
        "gpu": {"deviceClassName": "gpu.nvidia.com"},
    }
    pod, templates = rendered(spec)
    (template,) = templates
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["name"].startswith("m-gpu-")
    assert template["spec"]["spec"]["devices"]["requests"] == [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "allocationMode": "ExactCount",
                "count": 2,
            },
        }
    ]
    assert pod["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    resources = pod["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpu"}]
    # No device-plugin count: the GPU headroom ledger sees none, the host requests stay.
    assert pod_gpus(pod) == {}
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]


def test_a_new_count_is_a_new_template_since_a_template_cannot_change() -> None:
    base = {"model": "x", "gpu": {"deviceClassName": "gpu.nvidia.com"}}
    _, (one,) = rendered(base)
    _, (two,) = rendered({**base, "engine": {"tensorParallelSize": 2}})
    assert one["metadata"]["name"] != two["metadata"]["name"]


def test_the_users_template_is_claimed_and_none_rendered() -> None:
    pod, templates = rendered({"model": "x", "gpu": {"resourceClaimTemplateName": "eight-h100"}})
    assert templates == []
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "eight-h100"}]


def test_a_dra_replica_stays_one_pod_whatever_the_device_plugin_nodes_hold() -> None:
    spec = {
        "model": "x",
        "engine": {"tensorParallelSize": 8},
        "gpu": {"deviceClassName": "gpu.nvidia.com"},
    }
    result = plan(spec, DRA_AND_SMALL_NODES, name="m", namespace="ns")
    assert result.workloads[SERVER]["kind"] == "Deployment"
    assert result.nodes_per_replica == 1


def test_without_the_api_nothing_is_deployed_and_status_says_why() -> None:
    result = plan(
        {"model": "x", "gpu": {"deviceClassName": "gpu.nvidia.com"}},
        ClusterFacts(),
        name="m",
        namespace="ns",
    )
    assert result.blocked is not None
    reason, message = result.blocked
    assert reason == MISSING
    assert "resource.k8s.io/v1" in message
    assert result.workloads == {}


def test_device_plugin_rendering_is_unchanged_without_dra() -> None:
    pod, templates = rendered({"model": "x"})
    assert templates == [] and "resourceClaims" not in pod
    assert pod_gpus(pod) == {"nvidia.com/gpu": 1}
