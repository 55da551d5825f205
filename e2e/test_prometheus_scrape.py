"""A real Prometheus scrapes a locally started runtime the way the rendered ServiceMonitor says.

The scrape path users rely on, end to end: the operator renders the Deployment, Service,
ServiceMonitor and KEDA ScaledObject for one InferenceService; the Deployment's container command
starts the runtime here as a process (as in test_operator_local_serve.py); the ServiceMonitor's
endpoint (port name -> Service port -> container port, path, interval, scheme) becomes a plain
Prometheus scrape config, with the `namespace` target label the Prometheus operator adds; Debian's
`prometheus` scrapes it; and the ScaledObject's trigger query, exactly as rendered, is evaluated
through the HTTP API while requests queue in the engine. The chart's Grafana dashboards are
evaluated against the same Prometheus: every panel's query, its template variables filled in.

No cluster is needed. `make e2e` installs the prometheus package (cluster/prometheus.sh).
"""

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from infernetes.operator.facts import KEDA_GV, MONITORING_GV, ClusterFacts
from infernetes.operator.render import render

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = REPO_ROOT / "tests/operator/samples/cpu.yaml"
DASHBOARDS = sorted((REPO_ROOT / "helm/infernetes/dashboards").glob("*.json"))
# Grafana's $__rate_interval is at least four scrape intervals (the scrapes here are 1s apart)
# and grows with the dashboard's range: 5m keeps the load's samples in every window of the test
# however slowly a loaded machine scrapes and queries.
RATE_INTERVAL = "5m"
NAMESPACE = "demo"
# What the endpoint picker of the Gateway API Inference Extension reads (queue, KV usage, LoRA
# adapters, the cache's block size for its prefix index), and vLLM's prefix-cache counters.
PICKER_METRICS = (
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
    'vllm:cache_config_info{block_size!=""}',
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
)

pytestmark = [
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus"),
    pytest.mark.skipif(
        importlib.util.find_spec("infernetes.runtime.server") is None,
        reason="infernetes.runtime.server is not available",
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendered(model_dir: Path) -> dict[str, dict[str, Any]]:
    """The manifests by kind, for a CPU sample that queues (one sequence at a time)."""
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    spec["model"] = str(model_dir)
    spec["engine"]["maxNumSeqs"] = 1
    spec["monitoring"] = {"mode": "serviceMonitor", "interval": "1s"}
    spec["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "targetQueuedRequests": 1,
        "latency": {"ttftSeconds": 0.5, "interTokenSeconds": 0.05, "windowSeconds": 30},
        "keda": {"prometheusServerAddress": "http://prometheus.monitoring.svc:9090"},
    }
    facts = ClusterFacts(
        apis=frozenset({f"{MONITORING_GV}/ServiceMonitor", f"{KEDA_GV}/ScaledObject"})
    )
    manifests = render(spec, facts, name="tiny", namespace=NAMESPACE)
    return {manifest["kind"]: manifest for manifest in manifests}


def container_port(manifests: dict[str, dict[str, Any]], port_name: str) -> int:
    """The container port a ServiceMonitor endpoint's `port` (a Service port's name) reaches."""
    service_port = next(
        port for port in manifests["Service"]["spec"]["ports"] if port["name"] == port_name
    )
    target = service_port["targetPort"]
    if isinstance(target, int):
        return target
    container = manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return next(port["containerPort"] for port in container["ports"] if port["name"] == target)


def target_labels(manifests: dict[str, dict[str, Any]], pod: str) -> dict[str, str]:
    """The labels the Prometheus operator gives a ServiceMonitor's target: the namespace, the
    Service, the pod, its container and the endpoint's port name."""
    monitor = manifests["ServiceMonitor"]
    container = manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return {
        "namespace": monitor["metadata"]["namespace"],
        "service": manifests["Service"]["metadata"]["name"],
        "pod": pod,
        "container": container["name"],
        "endpoint": monitor["spec"]["endpoints"][0]["port"],
    }


def scrape_config(
    monitor: dict[str, Any],
    address: str,
    labels: dict[str, str],
    interval_default: str = "30s",
) -> dict[str, Any]:
    """A Prometheus scrape config for one ServiceMonitor endpoint at `address`.

    The Prometheus operator discovers the address through the Service's endpoints and labels the
    target (target_labels); here the address is the local process and the labels are static.
    """
    (endpoint,) = monitor["spec"]["endpoints"]
    namespace = monitor["metadata"]["namespace"]
    job: dict[str, Any] = {
        "job_name": f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/0",
        "scrape_interval": endpoint.get("interval", interval_default),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
        "static_configs": [{"targets": [address], "labels": labels}],
    }
    if "scrapeTimeout" in endpoint:
        job["scrape_timeout"] = endpoint["scrapeTimeout"]
    return {"scrape_configs": [job]}


def wait_for(check, what: str, process_logs: list[tuple[subprocess.Popen, Path]], timeout=180):
    deadline = time.monotonic() + timeout
    while True:
        for process, log in process_logs:
            assert process.poll() is None, (
                f"{process.args[0]} exited {process.returncode}:\n{log.read_text()[-4000:]}"
            )
        try:
            value = check()
            if value:
                return value
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[dict[str, dict[str, Any]], str, str, list]]:
    """The runtime (rendered argv) and Prometheus (translated ServiceMonitor), both running."""
    from infernetes.runtime.testing import make_tiny_llama

    manifests = rendered(make_tiny_llama(tmp_path / "tiny-llama"))
    monitor = manifests["ServiceMonitor"]
    in_pod = container_port(manifests, monitor["spec"]["endpoints"][0]["port"])
    container = manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    # A pod has a network of its own; this shared machine does not: loopback and a free port.
    args = [
        "--host=127.0.0.1"
        if arg == "--host=0.0.0.0"
        else f"--port={port}"
        if arg == f"--port={in_pod}"
        else arg
        for arg in container["args"]
    ]
    assert args.count(f"--port={port}") == 1
    command = [
        str(Path(sys.executable).with_name(container["command"][0])),
        *container["command"][1:],
        *args,
    ]
    env = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_")}
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    env["HF_HUB_OFFLINE"] = "1"
    config = tmp_path / "prometheus.yml"
    labels = target_labels(manifests, pod=f"{manifests['Deployment']['metadata']['name']}-0")
    config.write_text(yaml.safe_dump(scrape_config(monitor, f"127.0.0.1:{port}", labels)))
    prometheus_port = free_port()
    processes = []
    server_log, prometheus_log = tmp_path / "server.log", tmp_path / "prometheus.log"
    try:
        with server_log.open("w") as out:
            processes.append(
                (
                    subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT),
                    server_log,
                )
            )
        with prometheus_log.open("w") as out:
            prometheus = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            processes.append((prometheus, prometheus_log))
        yield (
            manifests,
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{prometheus_port}",
            processes,
        )
    finally:
        for process, _ in processes:
            stop(process)


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (promql, body)
    return body["data"]["result"]


async def queue_requests(server: str, count: int) -> list[int]:
    async with httpx.AsyncClient(timeout=300) as client:
        requests = [
            client.post(
                f"{server}/v1/completions",
                json={"model": "tiny", "prompt": "Hello", "max_tokens": 128, "ignore_eos": True},
            )
            for _ in range(count)
        ]
        return [response.status_code for response in await asyncio.gather(*requests)]


def test_prometheus_scrapes_rendered_servicemonitor_and_trigger_query_sees_the_queue(
    started,
) -> None:
    manifests, server, prometheus, processes = started
    wait_for(
        lambda: httpx.get(f"{server}/health", timeout=2).status_code == 200,
        "the runtime",
        processes,
    )

    def target_up() -> bool:
        body = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()
        return any(t["health"] == "up" for t in body["data"]["activeTargets"])

    wait_for(target_up, "Prometheus to scrape the runtime", processes, timeout=60)
    for metric in PICKER_METRICS:
        wait_for(
            lambda metric=metric: query(prometheus, f"count({metric})"),
            f"{metric} in Prometheus",
            processes,
            timeout=30,
        )

    triggers = {
        t["name"]: t["metadata"]["query"] for t in manifests["ScaledObject"]["spec"]["triggers"]
    }
    trigger_query = triggers["queued-requests"]
    latency_queries = [triggers["time-to-first-token"], triggers["inter-token-latency"]]
    # Idle: the query answers, with zero queued requests; the latency percentiles, with nothing
    # timed yet, answer 0 rather than NaN or nothing.
    idle = wait_for(lambda: query(prometheus, trigger_query), "the trigger query", processes)
    assert float(idle[0]["value"][1]) == 0
    for latency_query in latency_queries:
        assert [float(item["value"][1]) for item in query(prometheus, latency_query)] == [0.0]

    # Four requests against one sequence slot: three wait while the first decodes.
    peak = 0.0

    def watch_queue() -> None:
        nonlocal peak
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and peak == 0:
            result = query(prometheus, trigger_query)
            if result:
                peak = max(peak, float(result[0]["value"][1]))
            time.sleep(0.25)

    async def load_and_watch() -> list[int]:
        watcher = asyncio.create_task(asyncio.to_thread(watch_queue))
        statuses: list[int] = []
        # On an idle machine four requests can drain between two scrapes: queue more until
        # the query has seen them wait (or the watcher gives up).
        while not watcher.done():
            statuses += await queue_requests(server, 4)
        await watcher
        return statuses

    statuses = asyncio.run(load_and_watch())
    assert statuses and set(statuses) == {200}
    assert peak > 0, "the trigger query never saw a queued request"

    def latency_seen() -> bool:
        values = [float(query(prometheus, q)[0]["value"][1]) for q in latency_queries]
        return all(0 < value < 300 for value in values)

    wait_for(
        latency_seen, "the latency triggers to read the load's percentiles", processes, timeout=30
    )


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel, rows' collapsed panels included."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", ())]:
            found += [(inner["title"], t["expr"]) for t in inner.get("targets", ()) if "expr" in t]
    return found


def _seen(result: list[dict], counted: bool) -> list[dict]:
    """``result`` when it has series (and, for a counter of the load, one above zero)."""
    if counted and not any(float(r["value"][1]) > 0 for r in result):
        return []
    return result


def fill(expr: str, variables: dict[str, str]) -> str:
    """What Grafana sends: its variables and $__rate_interval replaced by values."""
    for name, value in {**variables, "__rate_interval": RATE_INTERVAL}.items():
        expr = expr.replace(f"${name}", value)
    assert "$" not in expr, expr
    return expr


def variable_values(prometheus: str, definition: str, variables: dict[str, str]) -> list[str]:
    """A `label_values(selector, label)` variable as Grafana resolves it (the labels API)."""
    selector, label = fill(definition, variables)[len("label_values(") : -1].rsplit(",", 1)
    response = httpx.get(
        f"{prometheus}/api/v1/label/{label.strip()}/values",
        params={"match[]": selector},
        timeout=5,
    )
    assert response.status_code == 200, (definition, response.text)
    return response.json()["data"]


def test_every_dashboard_query_runs_and_the_serving_panels_see_the_load(started) -> None:
    manifests, server, prometheus, processes = started
    wait_for(
        lambda: httpx.get(f"{server}/health", timeout=2).status_code == 200,
        "the runtime",
        processes,
    )
    model = httpx.get(f"{server}/v1/models", timeout=5).json()["data"][0]["id"]
    # a rate needs a sample from before the load: Prometheus has scraped the counters at rest
    wait_for(
        lambda: query(prometheus, "count(vllm:request_success_total)"),
        "the runtime's counters in Prometheus",
        processes,
        timeout=60,
    )
    statuses = asyncio.run(queue_requests(server, 4))
    assert set(statuses) == {200}
    # The finished requests' tokens are counted in Prometheus (a scrape after they ended).
    wait_for(
        lambda: query(prometheus, "sum(vllm:generation_tokens_total) > 0"),
        "generated tokens in Prometheus",
        processes,
        timeout=60,
    )
    expected = {
        "namespace": NAMESPACE,
        "service": manifests["Service"]["metadata"]["name"],
        "model": model,
    }
    assert {board.stem for board in DASHBOARDS} == {"serving", "operator"}
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        variables: dict[str, str] = {}
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            name = variable["name"]
            if path.stem == "serving":
                # Each variable's query offers this run's value, given the ones before it.
                values = variable_values(prometheus, variable["definition"], variables)
                assert expected[name] in values, (name, values)
            variables[name] = expected[name]
        for title, expr in panel_queries(board):
            filled = fill(expr, variables)
            query(prometheus, filled)  # a query that does not parse: 400
            if path.stem != "serving":
                continue
            # a scrape a loaded machine missed comes again: wait for the load's samples
            counted = "generation_tokens" in expr or "request_success" in expr
            wait_for(
                lambda filled=filled, counted=counted: _seen(query(prometheus, filled), counted),
                f"{title}: series for {filled}",
                processes,
                timeout=60,
            )
