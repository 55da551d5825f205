"""A time-to-first-token target scales real pods through KEDA (issue 38, items 1 and 6).

KEDA's operator and metrics API server built from its Go module run against the local control
plane (the `keda` fixture, cluster/keda_controller.py); Debian's Prometheus scrapes the serving
pods by the annotations `monitoring.mode: annotations` renders (cluster/host_prometheus.py).
An InferenceService with `autoscaling.latency.ttftSeconds`, 1 to 2 replicas, renders a
ScaledObject whose TTFT trigger KEDA evaluates against that Prometheus; the HPA KEDA creates reads
it through the external-metrics API the aggregation layer serves. Under a streamed load that
queues in the engine, p90 TTFT exceeds the target and the service scales out to 2 pods that
serve; after the load stops, the window empties (the query reads 0), and after the scale-down
window (30 s, set in the spec) it scales back in to 1. No request is lost meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from host_prometheus import HostPrometheus, PrometheusUnavailable
from infernetes.operator.render.autoscaling import TTFT_METRIC, latency_promql
from infernetes.operator.testing import (
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)
from serving_nodes import serving_spec
from streaming_load import StreamingLoad

NAME = "ttft"
# A target the tiny model meets alone but not with requests queued behind two sequences.
TTFT_TARGET_SECONDS = 0.05
WINDOW_SECONDS = 30  # the shortest latency window admission takes
# Engines starting (and the HPA's 15 s sync, KEDA's metric chain) on two busy cores.
STARTUP_TIMEOUT = 300


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-keda") as name:
        yield name


@pytest.fixture(scope="module")
def prometheus(cluster: Any, ns: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        server = HostPrometheus(cluster, tmp_path_factory.mktemp("prometheus"), namespaces=[ns])
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))
    with server:
        yield server


def service_spec(model_claim: str, model_dir: Path, prometheus_url: str) -> dict[str, Any]:
    return serving_spec(
        f"pvc://{model_claim}/{model_dir.name}",
        NAME,
        # requests beyond two queue: their first token waits
        engine={"maxNumSeqs": 2},
        cpu="100m",
        memory="512Mi",
        monitoring={"mode": "annotations"},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 2,
            "latency": {"ttftSeconds": TTFT_TARGET_SECONDS, "windowSeconds": WINDOW_SECONDS},
            "scaleDownStabilizationSeconds": WINDOW_SECONDS,
            "keda": {"prometheusServerAddress": prometheus_url},
        },
    )


def ready_replicas(cluster: Any, ns: str) -> int:
    deployment = kubectl_get(cluster, ns, "deployment", NAME) or {}
    return (deployment.get("status") or {}).get("readyReplicas") or 0


def pods(cluster: Any, ns: str) -> list[dict[str, Any]]:
    return kubectl_get(cluster, ns, "pods", "-l", f"app.kubernetes.io/instance={NAME}")["items"]


def scaled_object_ready(cluster: Any, ns: str) -> bool:
    scaled = kubectl_get(cluster, ns, "scaledobject", NAME) or {}
    conditions = (scaled.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_ttft_target_scales_out_under_load_and_back_in_after(
    cluster: Any,
    ns: str,
    keda: Any,
    prometheus: Any,
    model_claim: str,
    model_dir: Path,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    ttft_p90 = latency_promql(
        TTFT_METRIC, {"windowSeconds": WINDOW_SECONDS}, model_name=NAME, namespace=ns
    )
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator")):
        cluster.apply(
            {
                "apiVersion": "infernetes.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": NAME, "namespace": ns},
                "spec": service_spec(model_claim, model_dir, prometheus.url),
            }
        )
        wait_until(
            lambda: service_condition(cluster, ns, NAME, "Ready").get("status") == "True",
            timeout=STARTUP_TIMEOUT,
            what=f"{NAME} Ready",
        )
        wait_until(
            lambda: scaled_object_ready(cluster, ns), timeout=120, what="KEDA's ScaledObject Ready"
        )
        # KEDA's HPA reads the trigger through the aggregation layer: at rest, 0 s.
        hpa = wait_until(
            lambda: kubectl_get(cluster, ns, "hpa", f"keda-hpa-{NAME}"),
            timeout=60,
            what="the HPA KEDA creates",
        )
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "InferenceService"
        assert ready_replicas(cluster, ns) == 1

        load = StreamingLoad(api_client, ns, NAME, NAME, concurrency=16, max_tokens=12)
        load.start()
        try:
            wait_until(
                lambda: ready_replicas(cluster, ns) == 2,
                timeout=STARTUP_TIMEOUT,
                what="KEDA to scale out to 2 ready replicas under load",
            )
            measured = prometheus.value(ttft_p90)
            # The new pod serves its share of the load.
            wait_until(
                lambda: len(load.report.by_address) == 2, timeout=120, what="both replicas serving"
            )
        finally:
            report = load.stop()
        print(f"p90 TTFT under load {measured} s (target {TTFT_TARGET_SECONDS} s)")
        assert measured is not None and measured > TTFT_TARGET_SECONDS
        assert report.lost == [], f"{len(report.lost)} lost:\n" + "\n".join(
            map(str, report.lost[:40])
        )

        # The window empties (the query answers 0), then the scale-down window passes.
        wait_until(
            lambda: (
                kubectl_get(cluster, ns, "infsvc", NAME)["spec"]["replicas"] == 1
                and ready_replicas(cluster, ns) == 1
                and len(pods(cluster, ns)) == 1
            ),
            timeout=WINDOW_SECONDS * 2 + 180,
            what="KEDA to scale back in to 1 replica after the load",
        )
