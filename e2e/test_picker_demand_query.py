"""A real Prometheus evaluates the rendered activation query over series shaped like the endpoint
picker's.

The Gateway API Inference Extension's picker (v1.5.0, pkg/epp/metrics and pkg/epp/handlers)
counts every request it routes in `inference_objective_request_total` and every one it cannot
route in `inference_objective_request_error_total` (labels model_name, target_model_name and
error_code), and shows the requests its flow control holds (at zero replicas, with minReplicas
0) in the gauge `inference_extension_flow_control_queue_size`. The picker's image is not run
here: a stand-in HTTP endpoint serves those series in the Prometheus text format, and Debian's
`prometheus` scrapes it with a scrape config translated from the rendered picker ServiceMonitor
(interval, path, the `namespace` label the Prometheus operator adds, and its podTargetLabels as
the operator writes them: the pod label's name with `.`, `/` and `-` made `_`). The
ScaledObject's `gateway-requests` trigger query, exactly as rendered, then reads 0 while the
counters stand still and 1 once refused requests arrive, or while one request is held: KEDA
activates the service on that 1.

No cluster is needed. `make e2e` installs the prometheus package (cluster/prometheus.sh).
"""

import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import render

NAMESPACE, NAME = "demo", "chat"
SPEC = {
    "model": "org/model",
    "servedModelName": "chat",
    "monitoring": {"interval": "1s"},
    "routing": {},
    "autoscaling": {
        "minReplicas": 0,
        "maxReplicas": 2,
        "targetQueuedRequests": 5,
        "keda": {"prometheusServerAddress": "http://unused:9090"},
    },
}
FACTS = ClusterFacts.from_api_versions(
    ["inference.networking.k8s.io/v1", "keda.sh/v1alpha1", "monitoring.coreos.com/v1"]
)

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="needs Debian's prometheus"
)


class Counters:
    """The picker's two request counters, as its /metrics shows them."""

    def __init__(self) -> None:
        self.routed = 5  # requests routed before the service went to zero
        self.refused = 0  # none yet: the picker shows no error series until the first
        self.held = 0  # requests in the flow-control queue now
        self.lock = threading.Lock()

    def text(self) -> str:
        with self.lock:
            lines = [
                "# TYPE inference_objective_request_total counter",
                f'inference_objective_request_total{{model_name="chat",target_model_name="chat"}} '
                f"{self.routed}",
                "# TYPE inference_objective_request_error_total counter",
            ]
            if self.held:
                lines += [
                    "# TYPE inference_extension_flow_control_queue_size gauge",
                    'inference_extension_flow_control_queue_size{fairness_id="default-flow",'
                    f'priority="0",inference_pool="chat",model_name="chat",target_model_name=""}} '
                    f"{self.held}",
                ]
            if self.refused:
                lines.append(
                    'inference_objective_request_error_total{model_name="chat",'
                    'target_model_name="chat",error_code="ServiceUnavailable"} '
                    f"{self.refused}"
                )
        return "\n".join(lines) + "\n"


def serve(counters: Counters) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = counters.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def by_kind_and_name(manifests: list[dict]) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def scrape_config(monitor: dict[str, Any], pod_labels: dict[str, str], address: str) -> dict:
    """One ServiceMonitor endpoint as a static scrape config with the target labels the
    Prometheus operator would add (namespace, and each of podTargetLabels, sanitized)."""
    (endpoint,) = monitor["spec"]["endpoints"]
    labels = {"namespace": monitor["metadata"]["namespace"]}
    for label in monitor["spec"]["podTargetLabels"]:
        labels[re.sub(r"[^a-zA-Z0-9_]", "_", label)] = pod_labels[label]
    return {
        "scrape_configs": [
            {
                "job_name": f"serviceMonitor/{NAMESPACE}/{monitor['metadata']['name']}/0",
                "scrape_interval": endpoint["interval"],
                "metrics_path": endpoint["path"],
                "static_configs": [{"targets": [address], "labels": labels}],
            }
        ]
    }


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, str, Counters]]:
    """(Prometheus URL, the rendered activation query, the stand-in's counters)."""
    objects = by_kind_and_name(render(SPEC, FACTS, name=NAME, namespace=NAMESPACE))
    monitor = objects[("ServiceMonitor", f"{NAME}-epp")]
    picker = objects[("Deployment", f"{NAME}-epp")]
    (trigger,) = [
        t
        for t in objects[("ScaledObject", NAME)]["spec"]["triggers"]
        if t["name"] == "gateway-requests"
    ]
    counters = Counters()
    exporter = serve(counters)
    config = tmp_path / "prometheus.yml"
    pod_labels = picker["spec"]["template"]["metadata"]["labels"]
    address = f"127.0.0.1:{exporter.server_address[1]}"
    config.write_text(yaml.safe_dump(scrape_config(monitor, pod_labels, address)))
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}", trigger["metadata"]["query"], counters
    finally:
        process.terminate()
        process.wait(timeout=60)
        exporter.shutdown()


def wait_for_value(prometheus: str, promql: str, want: str, what: str) -> None:
    deadline = time.monotonic() + 120
    seen: Any = None
    while time.monotonic() < deadline:
        try:
            seen = query(prometheus, promql)
        except (httpx.HTTPError, ValueError):  # not listening, or not ready (plain text)
            seen = "Prometheus not answering yet"
        if isinstance(seen, list) and [sample["value"][1] for sample in seen] == [want]:
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: last result {seen}")


def test_activation_query_reads_0_while_still_and_1_once_refused_requests_arrive(
    prometheus: tuple[str, str, Counters],
) -> None:
    url, promql, counters = prometheus
    # Scraped twice or more, the routed counter has not moved: no demand.
    wait_for_value(url, promql, "0", "the activation query to read 0 over still counters")
    # Requests arrive at a service with no replica: the picker refuses them and counts them.
    with counters.lock:
        counters.refused = 1
    wait_for_value(
        url,
        'inference_objective_request_error_total{error_code="ServiceUnavailable"}',
        "1",
        "the first refusal scraped",
    )
    with counters.lock:
        counters.refused = 3
    wait_for_value(url, promql, "1", "the activation query to read 1 once requests are refused")


def test_activation_query_reads_1_while_the_picker_holds_a_request(
    prometheus: tuple[str, str, Counters],
) -> None:
    url, promql, counters = prometheus
    wait_for_value(url, promql, "0", "the activation query to read 0 over still counters")
    # One request held at zero replicas: no counter moves until it leaves the queue.
    with counters.lock:
        counters.held = 1
    wait_for_value(url, promql, "1", "the activation query to read 1 while a request is held")
