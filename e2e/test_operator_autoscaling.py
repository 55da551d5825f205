"""spec.autoscaling on the local control plane (issue 21, part 1): without KEDA's CRDs an
autoscaling/v2 HPA that the real HPA controller resolves through the InferenceService's scale
subresource; with KEDA's CRDs (from its Go module, cluster/go-module-crds.sh; no KEDA operator) a
ScaledObject the API server validates against KEDA's own schema, minReplicas 0 with activation;
the HPA replaced when KEDA appears; removing autoscaling deletes the object; invalid settings are
refused at admission naming the field. Without spec.routing nothing activates a service at zero
(the condition says so); with it (the Gateway API Inference Extension's CRDs installed) the
ScaledObject gets an activation trigger on the endpoint picker's request counters, valid to KEDA's
schema, and the picker gets a ServiceMonitor that labels its series."""

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    OperatorProcess,
    apply_crds,
    go_module_crds,
    install_crds,
    kubectl_get,
    remove_crds,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)

TIMEOUT = 90
PROMETHEUS = "http://prometheus.monitoring.svc:9090"


def keda_crds() -> list[dict]:
    return go_module_crds("github.com/kedacore/keda/v2", "KEDA_VERSION", "config/crd/bases/*.yaml")


@pytest.fixture(scope="module")
def crds(cluster: Any) -> Iterator[list[dict]]:
    found = keda_crds()
    remove_crds(cluster, found)  # start without KEDA whatever ran before
    yield found
    # Not waited for: on the shared, loaded cluster the CRDs' cleanup outlasted kubectl's 120 s
    # while every test had passed; the next module that needs them gone waits above.
    remove_crds(cluster, found, wait=False)


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-autoscaling") as name:
        yield name


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, crds: list[dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator-autoscaling")) as process:
        yield process


def isvc(name: str, **autoscaling: Any) -> dict:
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": "tiny/model",
            "engine": {"device": "cpu"},
            "autoscaling": autoscaling,
        },
    }


def hpa_condition(hpa: dict | None, kind: str) -> dict:
    found = [
        c for c in ((hpa or {}).get("status") or {}).get("conditions") or () if c["type"] == kind
    ]
    return found[0] if found else {}


def test_invalid_autoscaling_is_refused_naming_the_field(cluster: Any, ns: str) -> None:
    install_crds(cluster.kubectl)
    cases = [
        ({"minReplicas": 3, "maxReplicas": 2, "targetQueuedRequests": 1}, "maxReplicas"),
        ({"maxReplicas": 2}, "needs a target"),
        ({"minReplicas": 0, "maxReplicas": 2, "targetQueuedRequests": 1}, "needs autoscaling.keda"),
    ]
    for autoscaling, expected in cases:
        result = cluster.kubectl(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            input=yaml.safe_dump(isvc("bad", **autoscaling)),
            check=False,
        )
        assert result.returncode != 0, autoscaling
        assert "spec.autoscaling" in result.stderr and expected in result.stderr, result.stderr


def test_without_keda_an_hpa_on_the_scale_subresource(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        isvc(
            "hpa",
            minReplicas=1,
            maxReplicas=3,
            targetQueuedRequests=4,
            targetKVCacheUsagePercent=80,
        ),
        namespace=ns,
    )
    hpa = wait_until(
        lambda: kubectl_get(cluster, ns, "hpa", "hpa"),
        timeout=TIMEOUT,
        what="the HorizontalPodAutoscaler",
    )
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "name": "hpa",
    }
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [
        "vllm_num_requests_waiting",
        "vllm_kv_cache_usage_perc",
    ]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    # The HPA controller reads the InferenceService's /scale (no metrics API here to go on). A
    # controller-manager that started before our CRD existed says FailedGetScale until its
    # discovery is refreshed (every 30 s): wait for True.
    hpa = wait_until(
        lambda: (
            (h := kubectl_get(cluster, ns, "hpa", "hpa"))
            and (hpa_condition(h, "AbleToScale") or {}).get("status") == "True"
            and h
        ),
        timeout=TIMEOUT,
        what="the HPA controller to read its target's scale subresource",
    )
    assert hpa_condition(hpa, "AbleToScale")["status"] == "True", hpa["status"]
    # No custom-metrics API here: the HPA controller says it cannot get the pods' metric, and
    # the Autoscaling condition passes that on.
    active = wait_until(
        lambda: hpa_condition(kubectl_get(cluster, ns, "hpa", "hpa"), "ScalingActive"),
        timeout=TIMEOUT,
        what="the HPA controller to try the metrics",
    )
    assert active["status"] == "False", active
    # (an earlier FailedGetScale, while the controller's discovery caught up, may show first)
    told = wait_until(
        lambda: (
            (c := service_condition(cluster, ns, "hpa", "Autoscaling")).get("status") == "False"
            and c.get("reason") == active["reason"]
            and c
        ),
        timeout=TIMEOUT,
        what="the Autoscaling condition to tell why the HPA cannot scale",
    )
    assert told["message"].startswith("HorizontalPodAutoscaler hpa:")
    # What an autoscaler does, through the scale subresource: the Deployment follows.
    cluster.kubectl("scale", "infsvc", "hpa", "-n", ns, "--replicas=2")
    wait_until(
        lambda: (
            (kubectl_get(cluster, ns, "deployment", "hpa") or {}).get("spec", {}).get("replicas")
            == 2
        ),
        timeout=TIMEOUT,
        what="the Deployment to follow the scale subresource",
    )


def test_scale_to_zero_waits_for_keda_then_keda_replaces_the_hpa(
    cluster: Any, ns: str, operator: OperatorProcess, crds: list[dict]
) -> None:
    keda = {"prometheusServerAddress": PROMETHEUS, "activationQueuedRequests": 2}
    cluster.apply(
        isvc("zero", minReplicas=0, maxReplicas=4, targetQueuedRequests=5, keda=keda),
        namespace=ns,
    )
    cluster.apply(
        isvc("one", minReplicas=1, maxReplicas=2, targetKVCacheUsagePercent=75, keda=keda),
        namespace=ns,
    )
    wait_until(
        lambda: (
            service_condition(cluster, ns, "zero", "Autoscaling").get("reason")
            == "ScaleToZeroNeedsKEDA"
        ),
        timeout=TIMEOUT,
        what="ScaleToZeroNeedsKEDA",
    )
    assert service_condition(cluster, ns, "zero", "Autoscaling")["status"] == "False"
    assert kubectl_get(cluster, ns, "hpa", "zero") is None
    wait_until(
        lambda: kubectl_get(cluster, ns, "hpa", "one"), timeout=TIMEOUT, what="the HPA of one"
    )

    apply_crds(cluster, crds)
    zero = wait_until(
        lambda: kubectl_get(cluster, ns, "scaledobject", "zero"),
        timeout=TIMEOUT,
        what="a ScaledObject once KEDA's API is served",
    )
    assert zero["spec"]["scaleTargetRef"]["kind"] == "InferenceService"
    assert zero["spec"]["minReplicaCount"] == 0 and zero["spec"]["maxReplicaCount"] == 4
    (trigger,) = zero["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["activationThreshold"] == "2"
    assert trigger["metadata"]["query"] == (
        f'sum(vllm:num_requests_waiting{{namespace="{ns}",model_name="tiny/model"}})'
    )
    assert zero["metadata"]["ownerReferences"][0]["name"] == "zero"
    # Nothing records demand while no replica runs (no spec.routing): the condition says so.
    wait_until(
        lambda: (
            service_condition(cluster, ns, "zero", "Autoscaling").get("reason")
            == "NothingActivatesFromZero"
        ),
        timeout=TIMEOUT,
        what="the Autoscaling condition to say nothing activates the ScaledObject from zero",
    )
    wait_until(
        lambda: kubectl_get(cluster, ns, "scaledobject", "one"), timeout=TIMEOUT, what="one's"
    )
    wait_until(
        lambda: kubectl_get(cluster, ns, "hpa", "one") is None,
        timeout=TIMEOUT,
        what="one's HPA deleted",
    )

    # Autoscaling removed: the ScaledObject goes, and so does the condition.
    cluster.kubectl(
        "patch",
        "infsvc",
        "zero",
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/spec/autoscaling"}]',
    )
    wait_until(
        lambda: kubectl_get(cluster, ns, "scaledobject", "zero") is None,
        timeout=TIMEOUT,
        what="the ScaledObject deleted",
    )
    wait_until(
        lambda: not service_condition(cluster, ns, "zero", "Autoscaling"),
        timeout=TIMEOUT,
        what="the Autoscaling condition gone",
    )


def test_with_routing_the_pickers_requests_activate_from_zero(
    cluster: Any, ns: str, operator: OperatorProcess, crds: list[dict]
) -> None:
    extension = go_module_crds(
        "sigs.k8s.io/gateway-api-inference-extension",
        "INFERENCE_EXTENSION_VERSION",
        "config/crd/bases/inference.networking.k8s.io_*.yaml",
    )
    apply_crds(cluster, crds)
    apply_crds(cluster, extension)
    try:
        body = isvc(
            "woken",
            minReplicas=0,
            maxReplicas=2,
            targetQueuedRequests=5,
            keda={"prometheusServerAddress": PROMETHEUS},
        )
        body["spec"]["routing"] = {}
        cluster.apply(body, namespace=ns)
        scaled = wait_until(
            lambda: (
                (found := kubectl_get(cluster, ns, "scaledobject", "woken"))
                and len(found["spec"]["triggers"]) == 2
                and found
            ),
            timeout=TIMEOUT,
            what="a ScaledObject with the picker's activation trigger",
        )
        demand = scaled["spec"]["triggers"][1]
        assert (demand["name"], demand["metricType"]) == ("gateway-requests", "AverageValue")
        assert "inference_objective_request_error_total" in demand["metadata"]["query"]
        assert f'namespace="{ns}"' in demand["metadata"]["query"]
        assert 'infernetes_io_endpoint_picker_for="woken"' in demand["metadata"]["query"]
        monitor = wait_until(
            lambda: kubectl_get(cluster, ns, "servicemonitor", "woken-epp"),
            timeout=TIMEOUT,
            what="the picker's ServiceMonitor",
        )
        assert monitor["spec"]["podTargetLabels"] == ["infernetes.io/endpoint-picker-for"]
        wait_until(
            lambda: (
                service_condition(cluster, ns, "woken", "Autoscaling").get("reason")
                == "ScaledObject"
            ),
            timeout=TIMEOUT,
            what="Autoscaling True: activation from zero on the picker's requests",
        )
        cluster.kubectl("delete", "infsvc", "woken", "-n", ns, "--wait=true", "--timeout=60s")
    finally:
        remove_crds(cluster, extension, wait=False)
