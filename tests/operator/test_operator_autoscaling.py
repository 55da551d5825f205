"""spec.autoscaling: which autoscaler the cluster's APIs call for, what it holds, the condition
it reports, the CRD's fields and rules, and the RBAC it needs (the e2e module proves the API
server accepts the objects and evaluates the rules)."""

from typing import Any

import pytest
from infernetes.operator.crd import build_crd
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.rbac import CHILD_VERBS, cluster_rules
from infernetes.operator.render import plan
from infernetes.operator.render.autoscaling import promql
from infernetes.operator.status import autoscaling_condition, derive_status, transitions

KEDA = ClusterFacts.from_api_versions(["keda.sh/v1alpha1"])
NO_KEDA = ClusterFacts()
SERVER = "http://prometheus.monitoring.svc:9090"


def spec(**autoscaling: Any) -> dict[str, Any]:
    return {"model": "org/model", "servedModelName": "chat", "autoscaling": autoscaling}


def kinds(manifests: list[dict]) -> list[str]:
    return [m["kind"] for m in manifests]


def autoscaler_of(result: Any) -> dict:
    (found,) = [
        m for m in result.manifests if m["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    ]
    return found


def test_no_autoscaling_no_autoscaler_and_no_condition() -> None:
    result = plan({"model": "org/model"}, KEDA, name="svc", namespace="ns")
    assert kinds(result.manifests) == ["Deployment", "Service"]
    assert result.autoscaling is None


def test_keda_served_and_set_renders_a_scaled_object_on_the_scale_subresource() -> None:
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 5,
        "targetQueuedRequests": 4,
        "targetKVCacheUsagePercent": 90,
        "scaleUpStabilizationSeconds": 15,
        "keda": {"prometheusServerAddress": SERVER},
    }
    result = plan(spec(**autoscaling), KEDA, name="svc", namespace="ns", uid="u-1")
    scaled = autoscaler_of(result)
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # KEDA's own HPA must not carry the labels the operator watches its children by.
    excluded = scaled["metadata"]["annotations"]["scaledobject.keda.sh/hpa-excluded-labels"]
    assert set(excluded.split(",")) == set(scaled["metadata"]["labels"])
    body = scaled["spec"]
    assert body["scaleTargetRef"] == {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "name": "svc",
    }
    assert (body["minReplicaCount"], body["maxReplicaCount"]) == (1, 5)
    behavior = body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 15
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    queue, kv = body["triggers"]
    assert queue["metadata"] == {
        "serverAddress": SERVER,
        "query": 'sum(vllm:num_requests_waiting{namespace="ns",model_name="chat"})',
        "threshold": "4",
    }
    assert "metricType" not in queue  # AverageValue: the target is per replica
    assert kv["metricType"] == "Value"
    assert (
        kv["metadata"]["query"] == 'avg(vllm:kv_cache_usage_perc{namespace="ns",model_name="chat"})'
    )
    assert kv["metadata"]["threshold"] == "0.9"
    assert "cooldownPeriod" not in body  # only scaling to zero waits for it
    assert result.autoscaling is not None
    assert result.autoscaling[:2] == ("True", "ScaledObject")


def test_scale_to_zero_with_keda_activates_on_queued_requests() -> None:
    autoscaling = {
        "minReplicas": 0,
        "maxReplicas": 3,
        "targetQueuedRequests": 2,
        "scaleDownStabilizationSeconds": 120,
        "keda": {"prometheusServerAddress": SERVER, "activationQueuedRequests": 1},
    }
    body = autoscaler_of(plan(spec(**autoscaling), KEDA, name="svc", namespace="ns"))["spec"]
    assert body["minReplicaCount"] == 0
    assert body["cooldownPeriod"] == 120
    (queue,) = body["triggers"]
    assert queue["metadata"]["activationThreshold"] == "1"


@pytest.mark.parametrize("facts", [NO_KEDA, KEDA], ids=["no-keda", "keda-without-settings"])
def test_otherwise_an_hpa_on_pod_metrics_of_the_custom_metrics_api(facts: ClusterFacts) -> None:
    autoscaling = {
        "minReplicas": 2,
        "maxReplicas": 6,
        "targetQueuedRequests": 3,
        "targetKVCacheUsagePercent": 75,
        "scaleDownStabilizationSeconds": 60,
    }
    result = plan(spec(**autoscaling), facts, name="svc", namespace="ns")
    hpa = autoscaler_of(result)
    assert hpa["apiVersion"] == "autoscaling/v2"
    body = hpa["spec"]
    assert body["scaleTargetRef"]["kind"] == "InferenceService"
    assert (body["minReplicas"], body["maxReplicas"]) == (2, 6)
    assert body["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "3"},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_kv_cache_usage_perc"},
                "target": {"type": "AverageValue", "averageValue": "750m"},
            },
        },
    ]
    assert body["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 60
    assert result.autoscaling is not None
    assert result.autoscaling[:2] == ("True", "HorizontalPodAutoscaler")


def test_scale_to_zero_without_keda_renders_no_autoscaler_and_says_why() -> None:
    autoscaling = {
        "minReplicas": 0,
        "maxReplicas": 3,
        "targetQueuedRequests": 2,
        "keda": {"prometheusServerAddress": SERVER},
    }
    result = plan(spec(**autoscaling), NO_KEDA, name="svc", namespace="ns")
    assert kinds(result.manifests) == ["Deployment", "Service"]
    assert result.autoscaling is not None
    status, reason, message = result.autoscaling
    assert (status, reason) == ("False", "ScaleToZeroNeedsKEDA")
    assert "keda.sh/v1alpha1" in message and "cannot scale to zero" in message


def test_label_values_are_escaped_in_promql() -> None:
    query = promql("m", "sum", model_name='a"b\\c', namespace="ns")
    assert query == 'sum(m{namespace="ns",model_name="a\\"b\\\\c"})'


def test_the_condition_appears_only_with_autoscaling_and_a_false_one_is_an_event() -> None:
    common = {
        "generation": 1,
        "desired_replicas": 1,
        "deployment": None,
        "pods": [],
        "previous": None,
        "now": "2026-01-01T00:00:00Z",
    }
    without = derive_status(**common)
    assert "Autoscaling" not in [c["type"] for c in without["conditions"]]
    verdict = ("False", "ScaleToZeroNeedsKEDA", "no KEDA")
    status = derive_status(**common, autoscaling=verdict)
    (condition,) = [c for c in status["conditions"] if c["type"] == "Autoscaling"]
    assert (condition["status"], condition["reason"]) == ("False", "ScaleToZeroNeedsKEDA")
    assert ("Warning", "ScaleToZeroNeedsKEDA", "no KEDA") in transitions(
        without["conditions"], status["conditions"]
    )


def autoscaling_schema() -> dict[str, Any]:
    crd = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return crd["properties"]["spec"]["properties"]["autoscaling"]


def test_crd_types_and_documents_spec_autoscaling() -> None:
    schema = autoscaling_schema()
    props = schema["properties"]
    assert schema["required"] == ["maxReplicas"]
    assert props["minReplicas"]["minimum"] == 0 and props["minReplicas"]["default"] == 1
    assert props["targetKVCacheUsagePercent"]["maximum"] == 100
    assert props["scaleDownStabilizationSeconds"]["maximum"] == 3600
    assert props["keda"]["required"] == ["prometheusServerAddress"]
    for name, field in [*props.items(), *props["keda"]["properties"].items()]:
        assert field.get("description"), name  # kubectl explain has something to say
    assert "spec.replicas" in schema["description"]


def test_crd_rules_name_the_field_they_refuse() -> None:
    rules = {r["fieldPath"]: r for r in autoscaling_schema()["x-kubernetes-validations"][:3]}
    assert set(rules) == {".maxReplicas", ".targetQueuedRequests", ".minReplicas"}
    assert rules[".maxReplicas"]["rule"] == "self.maxReplicas >= self.minReplicas"
    assert "keda" in rules[".minReplicas"]["rule"]
    messages = [r["message"] for r in autoscaling_schema()["x-kubernetes-validations"]]
    assert all(message.startswith("autoscaling") for message in messages)


def test_rbac_covers_exactly_the_autoscalers() -> None:
    rules = cluster_rules()
    for group, resource in (
        ("keda.sh", "scaledobjects"),
        ("autoscaling", "horizontalpodautoscalers"),
    ):
        (found,) = [r for r in rules if r["apiGroups"] == [group]]
        assert found == {"apiGroups": [group], "resources": [resource], "verbs": CHILD_VERBS}


def test_an_autoscaler_that_cannot_scale_makes_the_condition_false() -> None:
    rendered = ("True", "HorizontalPodAutoscaler", "an HPA scales 1 to 3 replicas")
    hpa = {
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "svc"},
        "status": {
            "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
                {
                    "type": "ScalingActive",
                    "status": "False",
                    "reason": "FailedGetPodsMetric",
                    "message": "unable to get metric vllm_num_requests_waiting",
                },
            ]
        },
    }
    assert autoscaling_condition(rendered, hpa) == (
        "False",
        "FailedGetPodsMetric",
        "HorizontalPodAutoscaler svc: unable to get metric vllm_num_requests_waiting",
    )
    assert autoscaling_condition(rendered, {**hpa, "status": {}}) == rendered
    assert autoscaling_condition(rendered, None) == rendered
    scaled = {
        "kind": "ScaledObject",
        "metadata": {"name": "svc"},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "ScaledObjectCheckFailed",
                    "message": "bad query",
                }
            ]
        },
    }
    assert autoscaling_condition(rendered, scaled)[:2] == ("False", "ScaledObjectCheckFailed")
