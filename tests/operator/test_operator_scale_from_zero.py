"""Scale from zero on demand: with spec.routing the endpoint picker is scraped like the engine,
and a ScaledObject with minReplicas 0 gets an activation trigger on the picker's request
counters and the requests its flow control holds (the metric names of Gateway API Inference
Extension v1.5.0); without a scraped picker
nothing records demand at zero and the Autoscaling condition says what would."""

from typing import Any

from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import plan
from infernetes.operator.render.picker_metrics import demand_query

SERVER = "http://prometheus.monitoring.svc:9090"
POOL, KEDA, MONITORING = (
    "inference.networking.k8s.io/v1",
    "keda.sh/v1alpha1",
    "monitoring.coreos.com/v1",
)


def spec(min_replicas: int = 0, routing: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "org/model",
        "servedModelName": "chat",
        "autoscaling": {
            "minReplicas": min_replicas,
            "maxReplicas": 4,
            "targetQueuedRequests": 5,
            "keda": {"prometheusServerAddress": SERVER},
        },
        **extra,
    }
    if routing:
        body["routing"] = {}
    return body


def facts(*apis: str) -> ClusterFacts:
    return ClusterFacts.from_api_versions(apis)


def named(manifests: list[dict], kind: str, name: str) -> dict:
    (found,) = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def test_activation_trigger_reads_the_pickers_request_counters() -> None:
    result = plan(spec(), facts(POOL, KEDA, MONITORING), name="svc", namespace="ns")
    scaled = named(result.manifests, "ScaledObject", "svc")
    queue, demand = scaled["spec"]["triggers"]
    assert queue["name"] == "queued-requests"
    assert demand == {
        "type": "prometheus",
        "name": "gateway-requests",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": SERVER,
            # Requests the picker counted (routed or refused) or holds now (flow control).
            "query": (
                '(((sum(rate({__name__=~"inference_objective_request_total|'
                'inference_objective_request_error_total",namespace="ns",'
                'infernetes_io_endpoint_picker_for="svc"}[120s]))) or vector(0)) + '
                '((sum(inference_extension_flow_control_queue_size{namespace="ns",'
                'infernetes_io_endpoint_picker_for="svc"})) or vector(0))) > bool 0'
            ),
            # 0 or 1 as an average of 1 per replica: asks for one replica at most, so it never
            # holds more up than the queue and KV-cache targets want.
            "threshold": "1",
            "activationThreshold": "0",
        },
    }
    status, reason, message = result.autoscaling
    assert (status, reason) == ("True", "ScaledObject")
    assert "from zero when the endpoint picker sees requests" in message
    assert "flow control holds requests while no pod can take them, up to 120 s" in message


def test_picker_service_monitor_selects_the_picker_alone_and_labels_its_series() -> None:
    body = spec(monitoring={"interval": "15s", "labels": {"release": "prom"}})
    manifests = plan(body, facts(POOL, KEDA, MONITORING), name="svc", namespace="ns").manifests
    monitor = named(manifests, "ServiceMonitor", "svc-epp")
    picker_service = named(manifests, "Service", "svc-epp")
    engine_service = named(manifests, "Service", "svc")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= picker_service["metadata"]["labels"].items()
    assert not selector.items() <= engine_service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "http-metrics", "path": "/metrics", "interval": "15s"}
    ]
    assert {p["name"] for p in picker_service["spec"]["ports"]} >= {"http-metrics"}
    assert monitor["spec"]["podTargetLabels"] == ["infernetes.io/endpoint-picker-for"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    picker = named(manifests, "Deployment", "svc-epp")
    pod = picker["spec"]["template"]
    assert pod["metadata"]["labels"]["infernetes.io/endpoint-picker-for"] == "svc"
    # The annotations whatever the mode, so a monitoring API appearing restarts no picker.
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9090"


def test_picker_pod_monitor_scrapes_the_container_port() -> None:
    body = spec()
    manifests = plan(
        body, facts(POOL, KEDA, "monitoring.coreos.com/v1/PodMonitor"), name="svc", namespace="ns"
    ).manifests
    monitor = named(manifests, "PodMonitor", "svc-epp")
    picker = named(manifests, "Deployment", "svc-epp")
    assert monitor["spec"]["selector"]["matchLabels"] == picker["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert monitor["spec"]["podTargetLabels"] == ["infernetes.io/endpoint-picker-for"]


def test_annotation_scrapes_still_activate() -> None:
    result = plan(spec(), facts(POOL, KEDA), name="svc", namespace="ns")
    kinds = [m["kind"] for m in result.manifests]
    assert "ServiceMonitor" not in kinds and "PodMonitor" not in kinds
    triggers = named(result.manifests, "ScaledObject", "svc")["spec"]["triggers"]
    assert [t["name"] for t in triggers] == ["queued-requests", "gateway-requests"]


def test_rate_window_holds_four_scrapes() -> None:
    assert "[240s]" in demand_query(name="a", namespace="b", interval="1m")
    assert "[120s]" in demand_query(name="a", namespace="b", interval="500ms")


def test_without_routing_nothing_activates_and_the_condition_says_what_would() -> None:
    result = plan(spec(routing=False), facts(POOL, KEDA, MONITORING), name="svc", namespace="ns")
    scaled = named(result.manifests, "ScaledObject", "svc")
    assert [t["name"] for t in scaled["spec"]["triggers"]] == ["queued-requests"]
    status, reason, message = result.autoscaling
    assert (status, reason) == ("False", "NothingActivatesFromZero")
    assert "spec.routing" in message and "minReplicas 1" in message


def test_an_unscraped_picker_cannot_activate() -> None:
    body = spec(monitoring={"mode": "none"})
    result = plan(body, facts(POOL, KEDA, MONITORING), name="svc", namespace="ns")
    assert result.autoscaling[1] == "NothingActivatesFromZero"
    assert "ServiceMonitor" not in [m["kind"] for m in result.manifests]
    picker = named(result.manifests, "Deployment", "svc-epp")
    assert "annotations" not in picker["spec"]["template"]["metadata"]


def test_routing_without_the_pool_api_cannot_activate_yet() -> None:
    result = plan(spec(), facts(KEDA, MONITORING), name="svc", namespace="ns")
    assert result.autoscaling[1] == "NothingActivatesFromZero"
    assert result.conditions["Routing"][1] == "InferencePoolMissing"


def test_no_demand_trigger_above_zero() -> None:
    result = plan(spec(min_replicas=1), facts(POOL, KEDA, MONITORING), name="svc", namespace="ns")
    triggers = named(result.manifests, "ScaledObject", "svc")["spec"]["triggers"]
    assert [t["name"] for t in triggers] == ["queued-requests"]
    assert result.autoscaling[:2] == ("True", "ScaledObject")
