"""Debian's Prometheus on the host, scraping the local cluster's pods that serve.

Debian builds Prometheus without Kubernetes service discovery, so this module discovers the
pods itself, as kubernetes_sd_configs (role pod) with the usual annotation-scrape relabelling
would: every second it lists the pods of the given namespaces and writes those the operator
marks in `monitoring.mode: annotations` (`prometheus.io/scrape`, `port`, `path`), Running with
an IP, to a file Prometheus watches (file_sd_configs). They are scraped at their pod IPs, which
the host reaches (cluster/serving_nodes.py), with the labels the queries the operator renders
read: `namespace`, `pod`, and every pod label as a Prometheus label
(`infernetes.io/endpoint-picker-for` -> `infernetes_io_endpoint_picker_for`). Processes on the
host (the endpoint picker of cluster/host_picker.py) are added with `add_host_target` and the
labels their pod would give.

    with HostPrometheus(cluster, workdir, namespaces=[ns]) as prometheus:
        prometheus.url; prometheus.add_host_target("127.0.0.1:9090", {...}); prometheus.value('up')
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from infernetes.operator.testing import free_port

SCRAPE_INTERVAL = "2s"
ANNOTATION = "prometheus.io"
DISCOVERY_INTERVAL_S = 1.0


class PrometheusUnavailable(RuntimeError):
    """No `prometheus` on PATH (cluster/prometheus.sh installs Debian's)."""


def series_label(name: str) -> str:
    """A pod label's name as Prometheus's labelmap writes it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """file_sd target groups for the pods marked for an annotation-based scrape."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        notes = meta.get("annotations") or {}
        if notes.get(f"{ANNOTATION}/scrape") != "true" or status.get("phase") != "Running":
            continue
        if not status.get("podIP") or f"{ANNOTATION}/port" not in notes:
            continue
        labels = {series_label(k): v for k, v in (meta.get("labels") or {}).items()}
        labels.update(namespace=meta["namespace"], pod=meta["name"])
        labels["__metrics_path__"] = notes.get(f"{ANNOTATION}/path", "/metrics")
        target = f"{status['podIP']}:{notes[f'{ANNOTATION}/port']}"
        groups.append({"targets": [target], "labels": labels})
    return groups


class HostPrometheus:
    def __init__(self, cluster: Any, workdir: Path, *, namespaces: list[str]) -> None:
        if shutil.which("prometheus") is None:
            raise PrometheusUnavailable("needs Debian's prometheus (cluster/prometheus.sh)")
        self.cluster = cluster
        self.namespaces = namespaces
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.host_targets: list[dict[str, Any]] = []
        self.targets_path = {job: workdir / f"{job}-targets.json" for job in ("pods", "host")}
        for path in self.targets_path.values():
            path.write_text("[]")
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [
                {"job_name": job, "file_sd_configs": [{"files": [str(path)]}]}
                for job, path in self.targets_path.items()
            ],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._discovery = threading.Thread(target=self._discover, daemon=True)

    def __enter__(self) -> HostPrometheus:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Prometheus did not become ready:\n{tail}")
            time.sleep(0.5)
        self._discovery.start()

    def _discover(self) -> None:
        while not self._stopping.wait(DISCOVERY_INTERVAL_S):
            try:
                pods = [
                    pod
                    for namespace in self.namespaces
                    for pod in self.cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
                ]
            except Exception:  # a slow or failed listing keeps the last targets, as SD does
                continue
            self._write("pods", pod_targets(pods))

    def _write(self, job: str, groups: list[dict[str, Any]]) -> None:
        written = self.targets_path[job].with_suffix(".tmp")
        written.write_text(json.dumps(groups))
        written.replace(self.targets_path[job])

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def add_host_target(self, address: str, labels: dict[str, str]) -> None:
        """Scrapes `address` (`127.0.0.1:PORT`, a process on the host) with `labels` from now on
        (Prometheus watches the file)."""
        self.host_targets.append({"targets": [address], "labels": labels})
        self._write("host", self.host_targets)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector a query returns now."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read())["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single value a query returns now (None when it returns nothing)."""
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self._stopping.set()
        if self._discovery.is_alive():
            self._discovery.join()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
