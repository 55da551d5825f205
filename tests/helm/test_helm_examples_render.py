"""The samples in examples/ mean what their comments say: rendered by the operator (as
`infernetes operator render` does), each gives the workload it promises. The e2e tests check
that the API server accepts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.names import KIND
from infernetes.operator.render import plan
from infernetes.operator.render.workload import CACHE_MOUNT

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MONITORING = ClusterFacts.from_api_versions(
    ["monitoring.coreos.com/v1", "leaderworkerset.x-k8s.io/v1"]
)


def rendered(example: str, facts: ClusterFacts = MONITORING) -> dict[str, dict[str, Any]]:
    """{kind: object} of what the operator creates for the example's InferenceService."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / f"{example}.yaml").read_text()) if d]
    (resource,) = [d for d in docs if d["kind"] == KIND]
    result = plan(resource["spec"], facts, name=resource["metadata"]["name"], namespace="default")
    return {m["kind"]: m for m in result.manifests}


def server(objects: dict[str, dict[str, Any]]) -> tuple[dict, dict]:
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
def test_example_renders(example: str):
    objects = rendered(example)
    workload = "LeaderWorkerSet" if example == "multinode" else "Deployment"
    assert {workload, "Service"} <= set(objects)


def test_cpu_example_requests_no_gpu():
    pod, container = server(rendered("cpu-tiny"))
    assert "--device=cpu" in container["args"]
    assert not any("gpu" in key for key in container["resources"].get("limits", {}))
    assert not any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])


def test_gpu_examples_request_their_gpus():
    _, container = server(rendered("gpu-single"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    pod, container = server(rendered("tensor-parallel"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])


def test_monitoring_example_gets_a_service_monitor():
    monitor = rendered("monitoring-servicemonitor")["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"


def test_hf_token_comes_from_the_secret():
    _, container = server(rendered("hf-token-secret"))
    (token,) = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-credentials", "key": "token"}


def test_model_cache_example_mounts_its_claim_as_hf_home():
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "model-cache-pvc.yaml").read_text()) if d]
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    pod, container = server(rendered("model-cache-pvc"))
    assert {"name": "HF_HOME", "value": CACHE_MOUNT} in container["env"]
    volume = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_autoscaling_example_scales_to_zero_with_keda():
    keda = ClusterFacts.from_api_versions(["keda.sh/v1alpha1"])
    scaled = rendered("autoscaling", keda)["ScaledObject"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["triggers"][0]["metadata"]["activationThreshold"] == "0"
    assert "HorizontalPodAutoscaler" not in rendered("autoscaling", MONITORING)
    with_pool = ClusterFacts.from_api_versions(
        ["keda.sh/v1alpha1", "inference.networking.k8s.io/v1"]
    )
    triggers = rendered("autoscaling", with_pool)["ScaledObject"]["spec"]["triggers"]
    assert triggers[-1]["name"] == "gateway-requests"


def test_multinode_example_spans_two_nodes_of_eight_gpus():
    lws = rendered("multinode")["LeaderWorkerSet"]
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    for template in ("leaderTemplate", "workerTemplate"):
        container = group[template]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert "--tensor-parallel-size=16" in container["args"]


def test_routing_example_gets_a_pool_and_its_picker_when_the_extension_is_served():
    facts = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])
    objects = rendered("routing", facts)
    pool = objects["InferencePool"]
    assert pool["spec"]["endpointPickerRef"]["name"] == "llama-routed-epp"
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    assert {"Role", "RoleBinding", "ServiceAccount"} <= set(objects)
    assert "InferencePool" not in rendered("routing")  # not served: nothing, and a condition


def test_routing_example_gets_an_http_route_to_the_pool_when_the_gateway_api_is_served():
    facts = ClusterFacts.from_api_versions(
        ["inference.networking.k8s.io/v1", "gateway.networking.k8s.io/v1"]
    )
    route = rendered("routing", facts)["HTTPRoute"]
    assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["kind"], backend["name"]) == ("InferencePool", "llama-routed")
    pool_only = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])
    assert "HTTPRoute" not in rendered("routing", pool_only)
