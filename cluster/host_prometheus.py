"""Debian's Prometheus on the host, scraping the local cluster's pods that serve.

It discovers pods through the API server (kubernetes_sd_configs with the admin kubeconfig) and
scrapes those the operator marks in `monitoring.mode: annotations` (`prometheus.io/scrape`,
`port`, `path`) at their pod IPs, which the host reaches (cluster/serving_nodes.py). Targets get
the labels the queries the operator renders read: `namespace`, `pod`, and every pod label as a
Prometheus label (`infernetes.io/endpoint-picker-for` -> `infernetes_io_endpoint_picker_for`),
the usual annotation-scrape relabelling. Processes on the host (the endpoint picker of
cluster/host_picker.py) are added while it runs (a file Prometheus watches) with the labels their
pod would give.

    with HostPrometheus(cluster, workdir, namespaces=[ns]) as prometheus:
        prometheus.url; prometheus.add_host_target("127.0.0.1:9090", {...}); prometheus.value('up')
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

SCRAPE_INTERVAL = "2s"


class PrometheusUnavailable(RuntimeError):
    """No `prometheus` on PATH (cluster/prometheus.sh installs Debian's)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pod_scrape_job(kubeconfig: Path, namespaces: list[str]) -> dict[str, Any]:
    """The annotation-based pod scrape, as a Prometheus in the cluster would run it."""
    meta = "__meta_kubernetes_pod_"
    return {
        "job_name": "kubernetes-pods",
        "kubernetes_sd_configs": [
            {
                "role": "pod",
                "kubeconfig_file": str(kubeconfig),
                "namespaces": {"names": namespaces},
            }
        ],
        "relabel_configs": [
            {"source_labels": [f"{meta}annotation_prometheus_io_scrape"], "regex": "true",
             "action": "keep"},
            {"source_labels": [f"{meta}phase"], "regex": "Running", "action": "keep"},
            {"source_labels": [f"{meta}annotation_prometheus_io_path"], "regex": "(.+)",
             "target_label": "__metrics_path__"},
            {"source_labels": [f"{meta}ip", f"{meta}annotation_prometheus_io_port"],
             "regex": r"(.+);(\d+)", "replacement": "$1:$2", "target_label": "__address__"},
            {"action": "labelmap", "regex": f"{meta}label_(.+)"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": [f"{meta}name"], "target_label": "pod"},
        ],
    }  # fmt: skip


class HostPrometheus:
    def __init__(self, cluster: Any, workdir: Path, *, namespaces: list[str]) -> None:
        if shutil.which("prometheus") is None:
            raise PrometheusUnavailable("needs Debian's prometheus (cluster/prometheus.sh)")
        self.workdir = workdir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.host_targets_path = workdir / "host-targets.json"
        self.host_targets: list[dict[str, Any]] = []
        self.host_targets_path.write_text("[]")
        host_job = {
            "job_name": "host",
            "file_sd_configs": [{"files": [str(self.host_targets_path)]}],
        }
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [pod_scrape_job(cluster.kubeconfig, namespaces), host_job],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

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
        written = self.host_targets_path.with_suffix(".tmp")
        written.write_text(json.dumps(self.host_targets))
        written.replace(self.host_targets_path)

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
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
