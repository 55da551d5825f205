"""KEDA's operator and metrics API server against the local control plane.

cluster/keda.sh builds both from the github.com/kedacore/keda/v2 module (cached); the CRDs come
from the same module version (cluster/go-module-crds.sh). Both run on the host with the admin
kubeconfig, as the release runs them in the `keda` namespace, with what the cluster gives them
in place of a Deployment:

- certificates: one CA made here and one certificate, serving and client, which the operator's
  gRPC metrics service and the metrics API server's client of it present to each other (the
  release's cert rotation needs in-cluster Services), and which the metrics API server serves
  HTTPS with;
- the external-metrics APIService: the aggregation layer (the API server's front-proxy flags,
  cluster/localcluster.py) reaches the metrics API server through a Service of type
  ExternalName `localhost` (the aggregator dials an ExternalName Service's name; a ClusterIP
  would need kube-proxy), checked against the CA in the APIService's caBundle.

    keda = Keda(cluster, workdir)
    keda.start()  ...  keda.stop()
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from infernetes.operator.testing import free_port
from kube_pki import ClusterPKI

CLUSTER_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = CLUSTER_DIR / "keda.sh"
NAMESPACE = "keda"  # the release's; the operator keeps its cluster-wide objects' state there
METRICS_SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
EXTERNAL_METRICS = "/apis/external.metrics.k8s.io/v1beta1"
KEDA_FINALIZER = "finalizer.keda.sh"


class KedaUnavailable(RuntimeError):
    """KEDA cannot be built here (no Go toolchain): a test skips."""


def build() -> Path:
    """The cache directory holding bin/keda-operator and bin/keda-metrics-apiserver (built if
    missing: a cold build takes tens of minutes)."""
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode == 3:
        raise KedaUnavailable("KEDA needs a Go toolchain to build (cluster/keda.sh)")
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Keda:
    def __init__(self, cluster: Any, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.home = build()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def log_tails(self, chars: int = 3000) -> str:
        return "\n".join(
            f"===== {name} =====\n{self.log_path(name).read_text(errors='replace')[-chars:]}"
            for name in self.processes
        )

    def start(self, timeout: float = 120) -> None:
        """Starts the operator, then the metrics API server, registers the APIService and waits
        until the API server serves external metrics through it."""
        if not self._aggregation_configured():
            raise RuntimeError(
                "the API server has no front-proxy (requestheader) configuration: restart the "
                "cluster (`make cluster-down cluster`) with this checkout's cluster/localcluster.py"
            )
        certs = self.workdir / "keda-certs"
        pki = ClusterPKI(certs)  # ca.crt, as the release's certificate secret names it
        pki.issue(
            "tls",
            "keda",
            server=True,
            client=True,
            dns_names=("localhost", f"{METRICS_SERVICE}.{NAMESPACE}.svc"),
            ip_addresses=("127.0.0.1",),
        )
        self.cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        grpc_port, operator_health = free_port(), free_port()
        env = dict(self.cluster.env)  # KUBECONFIG: the admin's
        # WATCH_NAMESPACE empty: every namespace (the operator refuses to start without it).
        env.update(
            KEDA_CLUSTER_OBJECT_NAMESPACE=NAMESPACE, POD_NAMESPACE=NAMESPACE, WATCH_NAMESPACE=""
        )
        self._launch(
            "keda-operator",
            [
                "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{operator_health}",
                f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
                f"--cert-dir={certs}",
                f"--ca-dir={certs}",
                "--enable-cert-rotation=false",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
                "--zap-log-level=info",
            ],
            env,
        )
        self._wait(lambda: _ready(operator_health), timeout, "the KEDA operator /readyz")
        port = free_port()
        kubeconfig = str(self.cluster.kubeconfig)
        self._launch(
            "keda-metrics-apiserver",
            [
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--port={free_port()}",  # its own Prometheus metrics
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--cert-dir={certs}",
                f"--metrics-service-address=127.0.0.1:{grpc_port}",
                f"--lister-kubeconfig={kubeconfig}",  # else it looks for in-cluster config
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--zap-log-level=info",
            ],
            env,
        )
        self.cluster.apply(self._api_objects(port, pki.ca.cert.read_bytes()), server_side=True)
        self._wait(
            self._serves_external_metrics, timeout, "external metrics through the API server"
        )

    def _aggregation_configured(self) -> bool:
        config = self.cluster.kubectl_json(
            "get", "configmap", "extension-apiserver-authentication", "-n", "kube-system"
        )
        return "requestheader-client-ca-file" in config.get("data", {})

    def _api_objects(self, port: int, ca: bytes) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": API_SERVICE},
                "spec": {
                    "service": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "port": port},
                    "caBundle": base64.b64encode(ca).decode(),
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ]

    def _serves_external_metrics(self) -> bool:
        return self.cluster.kubectl("get", "--raw", EXTERNAL_METRICS, check=False).returncode == 0

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> None:
        with self.log_path(name).open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [str(self.home / "bin" / name), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            exited = [name for name, p in self.processes.items() if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                self.stop()
                reason = f"{exited} exited" if exited else f"timed out after {timeout:.0f} s"
                raise RuntimeError(f"KEDA: waiting for {what}: {reason}\n{self.log_tails()}")
            time.sleep(0.5)

    def stop(self) -> None:
        """The APIService first: with its server gone, API discovery reports it unavailable.
        Then KEDA's finalizers go from the ScaledObjects left: only KEDA removes them, so without
        it they (their namespaces, KEDA's CRDs) would stay terminating for good. The HPAs KEDA made
        are owned by their ScaledObjects and go with them."""
        self.cluster.kubectl("delete", "apiservice", API_SERVICE, "--ignore-not-found", check=False)
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.release_scaled_objects()

    def release_scaled_objects(self) -> None:
        found = self.cluster.kubectl(
            "get", "scaledobjects.keda.sh", "-A", "-o", "json", check=False
        )
        if found.returncode != 0:  # the CRD is gone: nothing holds a finalizer
            return
        for item in json.loads(found.stdout)["items"]:
            kept = [f for f in item["metadata"].get("finalizers") or () if f != KEDA_FINALIZER]
            if kept == (item["metadata"].get("finalizers") or []):
                continue
            self.cluster.kubectl(
                "patch",
                "scaledobjects.keda.sh",
                item["metadata"]["name"],
                "-n",
                item["metadata"]["namespace"],
                "--type=merge",
                "-p",
                json.dumps({"metadata": {"finalizers": kept or None}}),
                check=False,
            )
