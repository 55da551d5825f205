"""Scale from zero that holds the first request (issue 38, item 2), on pods that serve: an
InferenceService at zero replicas with `autoscaling.minReplicas: 0` and `spec.routing`, whose
picker the operator renders with the Inference Extension's flow control (v1.5.0, on by default at
minReplicas 0). The picker (cluster/epp.sh) runs on this machine with the rendered command line
and is asked as Envoy asks (ext-proc, epp-pick).

- With no replica and nothing scaling it up, a request waits `routing.flowControl.holdSeconds`
  in the picker, then is refused with 503 ("request timed out in queue").
- With a longer hold, a request waits while its demand shows in the picker's
  `inference_extension_flow_control_queue_size`. Debian's Prometheus scrapes the picker with the
  labels its pod would have (cluster/host_prometheus.py), and KEDA itself (its operator and
  metrics API server from its Go module, the `keda` fixture) reads the rendered activation query
  and sets the InferenceService's replicas to 1 through the scale subresource. The held request
  is released to the new pod once it is ready, and served: the first request after zero gets no
  error.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from host_picker import HostPicker, PickerUnavailable, build, rendered_picker_args
from host_prometheus import HostPrometheus, PrometheusUnavailable
from infernetes.operator.render.picker_metrics import PICKER_SERIES_LABEL
from infernetes.operator.testing import (
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)
from serving_nodes import serving_spec

NAME = "zero"
# One engine starting on two busy cores: the held request waits for it.
LONG_HOLD_SECONDS = 300
# Where the ScaledObject points while KEDA does not run (the first test).
UNUSED_PROMETHEUS = "http://prometheus.monitoring.svc:9090"


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-zero") as name:
        yield name


@pytest.fixture(scope="module")
def prometheus(cluster: Any, ns: str, tmp_path_factory: Any) -> Iterator[HostPrometheus]:
    try:
        server = HostPrometheus(cluster, tmp_path_factory.mktemp("prometheus"), namespaces=[ns])
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))
    with server:
        yield server


@pytest.fixture(scope="module")
def picker_binary() -> Path:
    try:
        return build("epp.sh")
    except PickerUnavailable as exc:
        pytest.skip(str(exc))


def spec(
    model_claim: str, model_dir: Path, hold_seconds: int, prometheus_url: str = UNUSED_PROMETHEUS
) -> dict[str, Any]:
    return serving_spec(
        f"pvc://{model_claim}/{model_dir.name}",
        NAME,
        replicas=0,
        monitoring={"mode": "annotations"},
        autoscaling={
            "minReplicas": 0,
            "maxReplicas": 1,
            "targetQueuedRequests": 5,
            "keda": {"prometheusServerAddress": prometheus_url},
        },
        routing={"flowControl": {"holdSeconds": hold_seconds, "maxHeldRequests": 8}},
    )


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, extension_crds: None, keda_crds: None, tmp_path_factory: Any
) -> Iterator[None]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator")):
        yield


def picker_args_holding(cluster: Any, ns: str, hold_seconds: int) -> list[str]:
    """The rendered picker's arguments once they hold requests `hold_seconds`."""
    return wait_until(
        lambda: (
            (args := rendered_picker_args_or_none(cluster, ns))
            and any(f"defaultRequestTTL: {hold_seconds}s" in arg for arg in args)
            and args
        ),
        timeout=60,
        what=f"a picker rendered to hold requests {hold_seconds} s",
    )


def rendered_picker_args_or_none(cluster: Any, ns: str) -> list[str] | None:
    if kubectl_get(cluster, ns, "deployment", f"{NAME}-epp") is None:
        return None
    return rendered_picker_args(cluster, ns, NAME)


@contextlib.contextmanager
def host_picker(
    cluster: Any, ns: str, binary: Path, args: list[str], log: Path
) -> Iterator[HostPicker]:
    picker = HostPicker(
        binary,
        args,
        kubeconfig=cluster.kubeconfig,
        namespace=ns,
        log=log,
        answer_within=LONG_HOLD_SECONDS + 60,
    )
    try:
        yield picker
    except BaseException:
        print(picker.log_tail())
        raise
    finally:
        picker.stop()


def completion() -> dict[str, Any]:
    return {"model": NAME, "prompt": "Hello there", "max_tokens": 2, "temperature": 0}


def held_requests(picker: HostPicker) -> float:
    """The requests the picker's flow control holds now (0 before its metrics are served)."""
    try:
        return picker.metric("inference_extension_flow_control_queue_size")
    except OSError:
        return 0


def answer(picker: HostPicker) -> dict[str, Any] | None:
    """The picker's answer to one request: an endpoint, or its refusal; None while its ext-proc
    server is not up yet."""
    routed = picker.route(completion())
    if "endpoint" in routed or routed["error"].startswith("the picker refused"):
        return routed
    return None


def test_at_zero_a_request_waits_its_hold_then_gets_503(
    cluster: Any,
    ns: str,
    operator: None,
    model_claim: str,
    model_dir: Path,
    picker_binary: Path,
    tmp_path: Path,
) -> None:
    cluster.apply(
        {
            "apiVersion": "infernetes.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": spec(model_claim, model_dir, hold_seconds=3),
        }
    )
    args = picker_args_holding(cluster, ns, 3)
    autoscaling = wait_until(
        lambda: service_condition(cluster, ns, NAME, "Autoscaling").get("message"),
        timeout=60,
        what="the Autoscaling condition",
    )
    assert "flow control holds requests while no pod can take them, up to 3 s" in autoscaling
    assert kubectl_get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 0
    with host_picker(cluster, ns, picker_binary, args, tmp_path / "picker.log") as picker:
        refused = wait_until(lambda: answer(picker), timeout=60, what="the picker's answer")
    # "503 inference error: ServiceUnavailable - request timed out in queue: ... TTL expired"
    assert "refused the request: 503 " in refused["error"], refused
    assert "request timed out in queue" in refused["error"], refused


def test_at_zero_keda_brings_up_a_replica_for_the_held_request_which_it_serves(
    cluster: Any,
    ns: str,
    operator: None,
    keda: Any,
    prometheus: HostPrometheus,
    model_claim: str,
    model_dir: Path,
    picker_binary: Path,
    tmp_path: Path,
) -> None:
    cluster.apply(
        {
            "apiVersion": "infernetes.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": ns},
            "spec": spec(model_claim, model_dir, LONG_HOLD_SECONDS, prometheus.url),
        }
    )
    args = picker_args_holding(cluster, ns, LONG_HOLD_SECONDS)
    with host_picker(cluster, ns, picker_binary, args, tmp_path / "picker.log") as picker:
        # The labels the picker's pod and its ServiceMonitor would give its series.
        prometheus.add_host_target(
            f"127.0.0.1:{picker.metrics_port}",
            {"namespace": ns, PICKER_SERIES_LABEL: NAME},
        )
        answers: list[dict[str, Any]] = []
        held = threading.Thread(
            target=lambda: answers.append(
                wait_until(lambda: answer(picker), timeout=60, what="the picker's answer")
            )
        )
        held.start()
        # The demand KEDA's activation query reads: a request held in the picker's queue.
        wait_until(
            lambda: held_requests(picker) >= 1,
            timeout=60,
            what="the request held in the picker's flow-control queue",
        )
        assert not answers  # still waiting: no replica, no refusal
        assert kubectl_get(cluster, ns, "deployment", NAME)["spec"]["replicas"] == 0
        # KEDA reads the held request through Prometheus and activates the service.
        held_since = time.monotonic()
        held.join(timeout=LONG_HOLD_SECONDS + 90)
        print(
            f"the held request was released {time.monotonic() - held_since:.1f} s after it showed"
        )
        assert answers and "endpoint" in answers[0], answers
        assert kubectl_get(cluster, ns, "infsvc", NAME)["spec"]["replicas"] == 1
        scaled = kubectl_get(cluster, ns, "scaledobject", NAME)["status"]["conditions"]
        assert {"type": "Active", "status": "True"}.items() <= next(
            c for c in scaled if c["type"] == "Active"
        ).items(), scaled
        response = httpx.post(
            f"http://{answers[0]['endpoint']}/v1/completions",
            content=answers[0]["body"],
            headers={"content-type": "application/json"},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] is not None
