"""Helpers for running the operator as a real process against a cluster (e2e tests, benchmarks).

Nothing here is used by the operator itself; it mirrors how the chart runs it: its own
ServiceAccount bound to the generated least-privilege ClusterRole, a token for that account,
`infernetes operator run`, health and metrics on loopback ports. `refused_value` makes up a
value admission must refuse, for the tests of each refusal.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from infernetes.operator.admission import Refusal
from infernetes.operator.crd import build_crd
from infernetes.operator.peering import peering_crds
from infernetes.operator.rbac import rbac_manifests

REPO = Path(__file__).resolve().parent.parent
# A minimal stand-in for the Prometheus operator's CRDs: only their API needs to be served.
MONITORING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors"))
]


def _example_item(items: dict[str, Any]) -> Any:
    if items.get("type") == "object":
        return {key: "/x" for key in items.get("required", ["key"])}
    return {"number": 1.0, "integer": 1}.get(items.get("type", ""), "x")


def refused_value(field: dict[str, Any], refusal: Refusal) -> Any:
    """A value of the field's type (from its CRD schema) that ``refusal`` does not allow."""
    kind = field.get("type")
    if "enum" in field:
        candidates = list(field["enum"])
    elif kind == "boolean":
        candidates = [True, False]
    elif kind == "integer":
        candidates = [field.get("minimum", 0) + step for step in range(3)]
    elif field.get("x-kubernetes-int-or-string"):  # a size: 1k or a plain count
        candidates = [1, 2, 3]
    elif kind == "number":
        candidates = [1.5, 0.0]
    elif kind == "string":
        candidates = ["x"]
    elif kind == "array":
        candidates = [[_example_item(field["items"])]]
    else:
        candidates = [{"key": "value"}]
    return next(value for value in candidates if value not in refusal.allowed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    condition: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.25
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def kubectl_get(cluster: Any, namespace: str, *what: str) -> Any:
    """`kubectl get WHAT -n NAMESPACE -o json`, decoded; None when it fails (e.g. not found)."""
    result = cluster.kubectl("get", *what, "-n", namespace, "-o", "json", check=False)
    return yaml.safe_load(result.stdout) if result.returncode == 0 else None


def service_condition(cluster: Any, namespace: str, name: str, kind: str) -> dict[str, Any]:
    """The InferenceService's condition of type `kind` ({} while it has none)."""
    status = (kubectl_get(cluster, namespace, "infsvc", name) or {}).get("status") or {}
    found = [c for c in status.get("conditions") or () if c["type"] == kind]
    return found[0] if found else {}


def pinned_version(name: str) -> str:
    """A version pinned in cluster/versions.env (NAME=value lines)."""
    for line in (REPO / "cluster" / "versions.env").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return value.strip()
    raise KeyError(f"{name} is not pinned in cluster/versions.env")


def go_module_crds(module: str, version_name: str, glob: str) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions a Go module holds under `glob`, at the version pinned as
    `version_name` (fetched once and cached by cluster/go-module-crds.sh)."""
    out = subprocess.run(
        [
            str(REPO / "cluster" / "go-module-crds.sh"),
            module,
            pinned_version(version_name),
            glob,
        ],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    directory = Path(out.strip().splitlines()[-1])
    documents = [
        doc
        for path in sorted(directory.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]
    return [doc for doc in documents if doc and doc.get("kind") == "CustomResourceDefinition"]


def apply_crds(cluster: Any, crds: list[dict[str, Any]]) -> None:
    """Install CRDs and wait until the API server serves them."""
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    for crd in crds:
        name = crd["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")


def remove_crds(cluster: Any, crds: list[dict[str, Any]], wait: bool = True) -> None:
    names = [crd["metadata"]["name"] for crd in crds]
    cluster.kubectl("delete", "crd", *names, "--ignore-not-found", f"--wait={str(wait).lower()}")


def install_crds(kubectl: Callable[..., Any]) -> None:
    """Apply our CRD (and kopf's peering CRDs, and the monitoring stand-ins) and wait for them."""
    documents = [build_crd(), *peering_crds(), *MONITORING_CRDS]
    kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        input=yaml.safe_dump_all(documents),
    )
    for doc in documents:
        name = doc["metadata"]["name"]
        # Polled rather than `kubectl wait`, which fails at once while a new CRD has no
        # conditions yet (a large one, such as ours, takes the API server a moment).
        wait_until(partial(_established, kubectl, name), timeout=60, what=f"crd/{name} Established")


def _established(kubectl: Callable[..., Any], crd: str) -> bool:
    jsonpath = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    result = kubectl("get", "crd", crd, "-o", jsonpath, check=False)
    return bool(result.stdout.strip() == "True")


def service_account_kubeconfig(
    kubectl: Callable[..., Any],
    *,
    namespace: str,
    path: Path,
    service_account: str = "infernetes-operator",
) -> Path:
    """Create the operator's ServiceAccount and RBAC, and a kubeconfig that uses its token."""
    manifests = rbac_manifests(namespace=namespace, service_account=service_account)
    kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        input=yaml.safe_dump_all(manifests),
    )
    token = kubectl(
        "create", "token", service_account, "-n", namespace, "--duration=6h"
    ).stdout.strip()
    admin = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": cluster["name"], "user": service_account}}
        ],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorProcess:
    """`infernetes operator run` as a child process with its own log file."""

    def __init__(
        self,
        *,
        kubeconfig: Path,
        log_path: Path,
        namespaces: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.namespaces = list(namespaces)
        self.extra_args = list(extra_args)
        self.env = dict(env if env is not None else os.environ)
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "infernetes.cli.main", "operator", "run"]
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        args += [
            "--bind-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            f"--health-port={self.health_port}",
            *self.extra_args,
        ]
        if not any(arg.startswith("--peering") for arg in self.extra_args):
            args.append("--standalone")
        return args

    def start(self, *, wait: bool = True, timeout: float = 60) -> "OperatorProcess":
        env = {**self.env, "KUBECONFIG": str(self.kubeconfig)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        if wait:
            wait_until(
                self.healthy,
                timeout=timeout,
                what=f"the operator's /healthz (log: {self.log_path})",
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
                return response.status, response.read().decode()
        except OSError:
            return 0, ""

    def healthy(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"the operator exited:\n{self.log()[-4000:]}")
        return self.get(self.health_port, "/healthz")[0] == 200

    def metrics(self) -> str:
        return self.get(self.metrics_port, "/metrics")[1]

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything, as when a node dies."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 30) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def peak_rss_bytes(self) -> int:
        """Peak resident memory (VmHWM) of the running operator process."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0


def create_namespace(cluster: Any, prefix: str, labels: dict[str, str] | None = None) -> str:
    """A namespace ``<prefix>-<random>`` whose default ServiceAccount exists (pods and the
    operator's token need it), with ``labels``."""
    import uuid

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    if labels:
        cluster.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in labels.items()))
    wait_until(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=60,
        what="the default ServiceAccount",
    )
    return name


def start_operator(cluster: Any, namespace: str, workdir: Path) -> OperatorProcess:
    """Our CRDs, the operator's ServiceAccount and RBAC, and the operator watching `namespace`
    with that account's token (what each e2e module of the operator needs)."""
    install_crds(cluster.kubectl)
    kubeconfig = service_account_kubeconfig(
        cluster.kubectl, namespace=namespace, path=workdir / "kubeconfig"
    )
    return OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=workdir / "operator.log",
        namespaces=[namespace],
        env=cluster.env,
    ).start()


@contextlib.contextmanager
def temporary_namespace(
    cluster: Any, prefix: str, labels: dict[str, str] | None = None
) -> Iterator[str]:
    """``create_namespace``, deleted on the way out (not waited for)."""
    name = create_namespace(cluster, prefix, labels)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextlib.contextmanager
def running_operator(cluster: Any, namespace: str, workdir: Path) -> Iterator[OperatorProcess]:
    """``start_operator``, stopped on the way out, its log's path printed for a failed test."""
    process = start_operator(cluster, namespace, workdir)
    try:
        yield process
    finally:
        process.stop()
        print(f"operator log: {process.log_path}")
