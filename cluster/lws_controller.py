"""The real LeaderWorkerSet controller against the local control plane.

cluster/lws.sh builds its manager from the sigs.k8s.io/lws module (cached) with the module's CRDs
and webhook configurations. Here the manager runs on the host with the admin kubeconfig, its
webhook server on 127.0.0.1 with a certificate from a CA made for it (the release's own cert
rotation needs an in-cluster Service), and the webhook configurations point at it by `url:`.
Its pod webhook is what puts LWS_LEADER_ADDRESS / LWS_WORKER_INDEX / LWS_GROUP_SIZE into the
pods' containers, so it must be running before the controller creates pods.

    controller = LwsController(cluster, workdir)
    controller.install_crds(); controller.start()  ...  controller.stop(); controller.remove_crds()
"""

from __future__ import annotations

import base64
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kube_pki import ClusterPKI

CLUSTER_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = CLUSTER_DIR / "lws.sh"
PREFIX = "lws-"  # the release's kustomize namePrefix
KINDS = {
    "mutating-patch.yaml": "MutatingWebhookConfiguration",
    "validating-patch.yaml": "ValidatingWebhookConfiguration",
}


def build() -> Path:
    """The cache directory holding bin/lws-manager, crds/ and webhook/ (built if missing)."""
    out = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def crds(home: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in sorted((home / "crds").glob("*.yaml"))]


def webhook_configurations(home: Path, url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The release's webhook configurations as its kustomization patches them (the pod webhooks
    see only pods LWS labelled), each webhook calling `url` + its path."""
    configs = {
        doc["kind"]: doc
        for doc in yaml.safe_load_all((home / "webhook" / "manifests.yaml").read_text())
        if doc
    }
    for patch_file, kind in KINDS.items():
        for op in yaml.safe_load((home / "webhook" / patch_file).read_text()) or ():
            index = int(op["path"].rsplit("/", 1)[1])
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            configs[kind]["webhooks"][index] = op["value"]
    bundle = base64.b64encode(ca_bundle).decode()
    for config in configs.values():
        config["metadata"]["name"] = PREFIX + config["metadata"]["name"]
        for webhook in config["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": url + path, "caBundle": bundle}
    return list(configs.values())


class LwsController:
    def __init__(self, cluster: Any, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.home = build()
        self.log_path = workdir / "lws-manager.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.webhooks: list[dict[str, Any]] = []

    def install_crds(self) -> None:
        found = crds(self.home)
        self.cluster.apply(found, server_side=True)
        for crd in found:
            name = crd["metadata"]["name"]
            self.cluster.kubectl(
                "wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}"
            )

    def remove_crds(self, wait: bool = True) -> None:
        names = [crd["metadata"]["name"] for crd in crds(self.home)]
        self.cluster.kubectl(
            "delete", "crd", *names, "--ignore-not-found", f"--wait={str(wait).lower()}"
        )

    def start(self, timeout: float = 60) -> None:
        certs = self.workdir / "lws-certs"
        pki = ClusterPKI(certs)
        pki.issue("tls", "lws-webhook", server=True, ip_addresses=("127.0.0.1",))
        webhook_port, health_port = _free_port(), _free_port()
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
        }
        config_path = self.workdir / "lws-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [
            str(self.home / "bin" / "lws-manager"),
            f"--config={config_path}",
            "--leader-elect=false",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{health_port}",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=self.cluster.env,  # KUBECONFIG: the admin's
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._ready(health_port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"the LWS controller did not become ready:\n{tail}")
            time.sleep(0.5)
        self.webhooks = webhook_configurations(
            self.home, f"https://127.0.0.1:{webhook_port}", pki.ca.cert.read_bytes()
        )
        self.cluster.apply(self.webhooks, server_side=True)

    def _ready(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        """Webhooks first: with the manager gone they would refuse every LWS object."""
        for config in self.webhooks:
            self.cluster.kubectl(
                "delete", config["kind"], config["metadata"]["name"], "--ignore-not-found"
            )
        self.webhooks = []
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
