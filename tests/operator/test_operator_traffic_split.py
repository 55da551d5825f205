"""spec.routing.splits -> the InferenceModelRewrite the endpoint picker splits a served model
name by, status.trafficSplit and the Routing condition; routing.flowControl -> the picker's
flow control (on by default at minReplicas 0). e2e/test_traffic_split.py measures the split
through the real picker on pods that serve."""

from typing import Any

import yaml
from infernetes.operator.crd import build_crd
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.picker_config import PRECISE, flow_control
from infernetes.operator.render import plan

POOL = "inference.networking.k8s.io/v1"
REWRITE = "inference.networking.x-k8s.io/v1alpha2"
ADAPTERS = {"adapters": [{"name": "canary", "source": "org/canary-lora"}]}


def spec(routing: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "org/model", "servedModelName": "chat", "routing": routing, **extra}


def split_spec(*weights: tuple[str, int]) -> dict[str, Any]:
    splits = [{"target": target, "weight": weight} for target, weight in weights]
    return spec({"splits": splits}, lora=ADAPTERS)


def of_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def picker_config(manifests: list[dict]) -> dict[str, Any]:
    (picker,) = [m for m in of_kind(manifests, "Deployment") if m["metadata"]["name"] == "svc-epp"]
    (config,) = [
        a
        for a in picker["spec"]["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--config-text=")
    ]
    return yaml.safe_load(config.removeprefix("--config-text="))


def test_split_renders_a_weighted_rewrite_of_the_served_name_for_the_pool() -> None:
    facts = ClusterFacts.from_api_versions([POOL, REWRITE])
    result = plan(split_spec(("svc", 90), ("canary", 10)), facts, name="svc", namespace="ns")
    (rewrite,) = of_kind(result.manifests, "InferenceModelRewrite")
    assert rewrite["apiVersion"] == REWRITE
    assert rewrite["metadata"]["name"] == "svc"
    assert rewrite["spec"] == {
        "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "svc"},
        "rules": [
            {
                "matches": [{"model": {"type": "Exact", "value": "chat"}}],
                "targets": [
                    {"modelRewrite": "chat", "weight": 90},
                    {"modelRewrite": "canary", "weight": 10},
                ],
            }
        ],
    }
    assert result.traffic_split == [
        {"target": "svc", "model": "chat", "weight": 90, "percent": 90.0},
        {"target": "canary", "model": "canary", "weight": 10, "percent": 10.0},
    ]
    status, reason, message = result.conditions["Routing"]
    assert (status, reason) == ("True", "InferencePool")
    assert "InferenceModelRewrite svc splits the requests for chat: chat 90%, canary 10%" in message


def test_a_target_of_weight_zero_gets_nothing_and_is_left_out_of_the_rewrite() -> None:
    facts = ClusterFacts.from_api_versions([POOL, REWRITE])
    result = plan(split_spec(("svc", 3), ("canary", 0)), facts, name="svc", namespace="ns")
    (rewrite,) = of_kind(result.manifests, "InferenceModelRewrite")
    assert rewrite["spec"]["rules"][0]["targets"] == [{"modelRewrite": "chat", "weight": 3}]
    assert [item["percent"] for item in result.traffic_split] == [100.0, 0.0]


def test_without_the_rewrite_api_routing_says_so_and_no_split_is_shown() -> None:
    facts = ClusterFacts.from_api_versions([POOL])
    result = plan(split_spec(("svc", 90), ("canary", 10)), facts, name="svc", namespace="ns")
    assert not of_kind(result.manifests, "InferenceModelRewrite")
    assert of_kind(result.manifests, "InferencePool")
    assert result.traffic_split == []
    status, reason, message = result.conditions["Routing"]
    assert (status, reason) == ("False", "InferenceModelRewriteMissing")
    assert "every request for chat goes to chat" in message


def test_crd_bounds_the_weights_and_names_the_targets_allowed() -> None:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    splits = root["properties"]["spec"]["properties"]["routing"]["properties"]["splits"]
    weight = splits["items"]["properties"]["weight"]
    assert (weight["minimum"], weight["maximum"]) == (0, 1000000)
    assert splits["x-kubernetes-list-map-keys"] == ["target"]
    assert "sum to more than 0" in splits["x-kubernetes-validations"][0]["message"]
    (target_rule,) = [
        r for r in root["x-kubernetes-validations"] if r.get("fieldPath") == ".spec.routing.splits"
    ]
    assert "self.metadata.name" in target_rule["rule"]
    assert "spec.lora.adapters" in target_rule["message"]
    status = root["properties"]["status"]["properties"]["trafficSplit"]
    assert set(status["items"]["properties"]) == {"target", "model", "weight", "percent"}


def test_flow_control_holds_requests_by_default_at_min_replicas_zero() -> None:
    facts = ClusterFacts.from_api_versions([POOL])
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "targetQueuedRequests": 5}
    config = picker_config(
        plan(spec({}, autoscaling=autoscaling), facts, name="svc", namespace="ns").manifests
    )
    assert config["featureGates"] == ["flowControl"]
    assert config["flowControl"] == {"maxRequests": "1000", "defaultRequestTTL": "120s"}
    held = {"holdSeconds": 30, "maxHeldRequests": 8}
    config = picker_config(
        plan(spec({"flowControl": held}), facts, name="svc", namespace="ns").manifests
    )
    assert config["flowControl"] == {"maxRequests": "8", "defaultRequestTTL": "30s"}
    assert "flowControl" not in picker_config(
        plan(spec({}), facts, name="svc", namespace="ns").manifests
    )


def test_llm_d_pickers_hold_no_requests() -> None:
    # llm-d's scheduler (precise scorer, or the P/D profiles) fails a request at zero endpoints:
    # no flow control is rendered for it, even at minReplicas 0.
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "targetQueuedRequests": 5}
    assert flow_control(spec({}, autoscaling=autoscaling)) is not None
    precise = spec({"scorers": [{"type": PRECISE, "weight": 1}]}, autoscaling=autoscaling)
    assert flow_control(precise) is None
    assert flow_control(spec({}, autoscaling=autoscaling, prefill={"replicas": 1})) is None
