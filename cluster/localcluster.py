"""A real local Kubernetes control plane made of processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake nodes with `nvidia.com/gpu` capacity, fake
Running pods). No container runtime is involved; every control-plane address is loopback.

On demand, `start_serving_nodes()` adds nodes whose pods really run: podkubelet processes
(cluster/serving_nodes.py, cluster/README.md) that start each container's command in a network
namespace of its own holding the pod's IP.

Command line (what `make cluster` / `make cluster-down` run):

    python cluster/localcluster.py up [--nodes N] [--serving-nodes N] [--state-dir DIR]
    python cluster/localcluster.py down [--state-dir DIR]             # stop by pid, remove state
    python cluster/localcluster.py status | logs [COMPONENT]

The state directory (default `.cluster/`) holds `kubeconfig` (admin, self-contained),
`state.json` (pids, ports), `pki/`, `etcd/` and `logs/<component>.log`. Binaries come from
`cluster/build.sh` (cached outside the repository). The e2e fixture in `e2e/conftest.py` drives
the same `LocalCluster` class.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kube_pki import APISERVER_DNS_NAMES, ClusterPKI
from serving_nodes import (
    ServingNodesUnavailable,
    build_podkubelet,
    check_host,
    free_bridge_indexes,
    podkubelet_args,
    write_images,
)

CLUSTER_DIR = Path(__file__).resolve().parent
REPO_ROOT = CLUSTER_DIR.parent
DEFAULT_STATE_DIR = REPO_ROOT / ".cluster"
BUILD_SCRIPT = CLUSTER_DIR / "build.sh"
NODE_MANIFEST = CLUSTER_DIR / "fake-gpu-node.yaml"
DEFAULT_NODES = 2
# Start order; stop runs in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The one name an extension API server accepts X-Remote-* headers from.
FRONT_PROXY_CLIENT = "front-proxy-client"

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The control plane could not be built, started or reached."""


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its command line and stderr."""

    def __init__(self, argv: list[str], result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        super().__init__(
            f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr.strip() or result.stdout.strip()}"
        )


def build_binaries() -> Path:
    """Runs cluster/build.sh (a no-op when the binaries are cached) and returns the bin dir.
    Build progress goes to stderr; a cold build takes tens of minutes on 2 cores."""
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def cached_bin_dir() -> Path:
    """Where build.sh puts (or has put) the binaries for the pinned versions."""
    out = subprocess.run(
        [str(BUILD_SCRIPT), "--print"], stdout=subprocess.PIPE, text=True, check=True
    ).stdout
    return Path(out.strip())


def wait_for(condition: Callable[[], T], *, timeout: float, what: str, interval: float = 0.25) -> T:
    """Polls `condition` until it returns something truthy and returns that; exceptions count as
    not yet. Raises TimeoutError naming `what` (and the last exception) after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except ClusterError:
            raise
        except Exception as exc:  # not ready yet: keep the reason for the timeout message
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_alive(pid: int, exe: str) -> bool:
    """True when `pid` runs `exe` and is not a zombie (guards against pid reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and cmdline == exe


def _tail(path: Path, lines: int) -> str:
    if not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass(frozen=True)
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


class LocalCluster:
    """One control plane, identified by its state directory.

    `LocalCluster(state_dir).start()` starts a new one; `LocalCluster(state_dir)` on a directory
    whose cluster is running attaches to it (`running()` tells). Helpers for tests and tools:
    `kubectl()`, `kubectl_json()`, `apply()`, `helm()`, `api_client()`, `env`, `log_tails()`.
    """

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, bin_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.logs_dir = self.state_dir / "logs"
        self._state_file = self.state_dir / "state.json"
        self._state: dict[str, Any] = (
            json.loads(self._state_file.read_text()) if self._state_file.exists() else {}
        )
        self.bin_dir = Path(bin_dir or self._state.get("bin_dir") or cached_bin_dir())
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ----- lifecycle

    def start(self, nodes: int = DEFAULT_NODES, timeout: float = 180.0) -> float:
        """Starts every component, creates `nodes` fake GPU nodes and waits until they are Ready.
        Returns the seconds it took. Raises ClusterError (with the logs) on failure."""
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {nodes}")
        missing = [b for b in (*COMPONENTS, "kubectl") if not (self.bin_dir / b).is_file()]
        if missing:
            raise ClusterError(f"missing binaries in {self.bin_dir}: {missing}; run {BUILD_SCRIPT}")
        if self.running():
            raise ClusterError(f"a cluster is already running in {self.state_dir}")
        started = time.monotonic()
        self.stop()  # leftovers of a crashed cluster in the same directory
        self.logs_dir.mkdir(parents=True)
        ports = _Ports(*(_free_port() for _ in range(5)))
        self._state = {
            "bin_dir": str(self.bin_dir),
            "ports": ports.__dict__,
            "processes": {},
            "nodes": [f"kwok-gpu-{i}" for i in range(nodes)],
        }
        try:
            self._write_pki_and_kubeconfigs(ports)
            self._launch("etcd", self._etcd_args(ports))
            wait_for(
                lambda: self._http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"),
                timeout=30,
                what="etcd /health",
            )
            self._launch("kube-apiserver", self._apiserver_args(ports))
            wait_for(
                lambda: self._api_ok("/readyz"), timeout=timeout, what="kube-apiserver /readyz"
            )
            self._launch("kube-controller-manager", self._controller_manager_args(ports))
            self._launch("kube-scheduler", self._scheduler_args(ports))
            self._launch("kwok", self._kwok_args())
            self.apply(self._node_manifests())
            wait_for(self._nodes_ready, timeout=timeout, what=f"{nodes} fake nodes Ready")
            # The service-account controller proves the controller-manager is working; pods in
            # a namespace are only admitted once its `default` service account exists.
            wait_for(
                lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout=timeout,
                what="the default service account",
            )
            wait_for(
                lambda: self._http_ok(f"https://127.0.0.1:{ports.scheduler}/healthz"),
                timeout=timeout,
                what="kube-scheduler /healthz",
            )
        except (TimeoutError, ClusterError, KubectlError, OSError) as exc:
            message = f"local cluster failed to start: {exc}\n{self.log_tails()}"
            self.stop(keep_logs=True)
            raise ClusterError(message) from exc
        elapsed = time.monotonic() - started
        self._state["startup_seconds"] = round(elapsed, 2)
        self._save_state()
        return elapsed

    def stop(self, keep_logs: bool = False) -> None:
        """Stops the processes this state directory records (by pid), then removes the state
        (all of it, or all but `logs/` when `keep_logs`)."""
        # Serving nodes first: they stop their pods and remove their network while the API
        # server can still take the pods' last status.
        self.stop_serving_nodes(delete_nodes=False)
        processes = self._state.get("processes", {})
        # One at a time, in reverse start order: the API server shuts down in about a second
        # while etcd is still there, but hangs for many seconds when etcd goes first.
        for name in reversed(COMPONENTS):
            if proc := processes.get(name):
                self._stop_process(name, proc, timeout=10)
        self._state = {}
        if not keep_logs:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            return
        for path in self.state_dir.iterdir() if self.state_dir.exists() else ():
            if path.is_dir() and path != self.logs_dir:
                shutil.rmtree(path)
            elif path.is_file():
                path.unlink()

    def _stop_process(self, name: str, proc: dict[str, Any], timeout: float) -> None:
        """SIGTERM, then SIGKILL after `timeout` s; reaps the child when this object started it."""
        if process_alive(proc["pid"], proc["exe"]):
            os.kill(proc["pid"], signal.SIGTERM)
            try:
                wait_for(
                    lambda: not process_alive(proc["pid"], proc["exe"]),
                    timeout=timeout,
                    what=f"{name} to exit",
                    interval=0.05,
                )
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc["pid"], signal.SIGKILL)
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()

    # ----- serving nodes (cluster/serving_nodes.py)

    @property
    def serving_nodes(self) -> list[str]:
        """Names of the running podkubelet nodes."""
        return list(self._state.get("serving_nodes", {}))

    def start_serving_nodes(
        self,
        count: int = 1,
        *,
        images: dict[str, Any] | None = None,
        restart_backoff: str = "10s",
        timeout: float = 60.0,
    ) -> list[str]:
        """Starts `count` podkubelet nodes (building the binary if it is not cached), waits until
        they are Ready and returns their names. `images` maps images to what their containers
        run (see cluster/README.md; default: any image, with this Python's environment first on
        PATH). `restart_backoff` is the first restart delay after a container exits (the
        kubelet's 10 s by default). Raises serving_nodes.ServingNodesUnavailable when this
        machine cannot run them."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        check_host()
        exe = build_podkubelet()
        images_file = write_images(self.state_dir / "podkubelet-images.json", images)
        started = self._state.setdefault("serving_nodes", {})
        names = []
        for index in free_bridge_indexes(count):
            name = f"podkubelet-{index}"
            node_dir = self.state_dir / "podkubelet" / name
            node_dir.mkdir(parents=True, exist_ok=True)
            args = podkubelet_args(
                name=name,
                index=index,
                kubeconfig=self.kubeconfig,
                images=images_file,
                state_dir=node_dir,
                # Container logs stay with the cluster's logs (kept for a failed test's report).
                log_dir=self.logs_dir / "pods",
                restart_backoff=restart_backoff,
            )
            child = self._spawn(name, str(exe), args)
            started[name] = {"pid": child.pid, "exe": str(exe)}
            names.append(name)
        self._save_state()
        wait_for(
            lambda: set(names) <= self._ready_nodes(),
            timeout=timeout,
            what=f"serving nodes {names} Ready",
        )
        return names

    def stop_serving_nodes(self, delete_nodes: bool = True) -> None:
        """Stops every podkubelet (each stops its pods: SIGTERM, then SIGKILL after 5 s) and,
        when `delete_nodes`, deletes their Node objects."""
        serving = self._state.get("serving_nodes")
        if not serving:
            return
        for name, proc in list(serving.items()):
            self._stop_process(name, proc, timeout=30)
            if delete_nodes:
                self.kubectl("delete", "node", name, "--wait=false", check=False)
            del serving[name]
        self._save_state()

    def running(self) -> bool:
        """True when every recorded process is alive and the API server answers /readyz."""
        processes = self._state.get("processes", {})
        if set(processes) != set(COMPONENTS) or not self._state_file.exists():
            return False
        if not all(process_alive(p["pid"], p["exe"]) for p in processes.values()):
            return False
        try:
            return self._api_ok("/readyz")
        except OSError:
            return False

    # ----- helpers for tests and tools

    @property
    def nodes(self) -> list[str]:
        """Names of the fake GPU nodes."""
        return list(self._state.get("nodes", []))

    @property
    def startup_seconds(self) -> float | None:
        """How long `start()` took for this cluster, as recorded in its state."""
        return self._state.get("startup_seconds")

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self._state['ports']['apiserver']}"

    @property
    def ca_cert(self) -> Path:
        """The cluster CA's certificate (PEM), which signed the API server's certificate."""
        return self.state_dir / "pki" / "ca.crt"

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG and the bin dir first on PATH: for launching kubectl, helm,
        or an operator process against this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster; raises KubectlError on failure when `check`."""
        return self._run_tool("kubectl", args, input, check, timeout)

    def kubectl_json(self, *args: str) -> Any:
        """`kubectl <args> -o json`, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Runs the cached helm binary against this cluster."""
        return self._run_tool("helm", args, input, check, timeout)

    def apply(
        self,
        manifests: str | dict | Iterable[dict],
        *,
        namespace: str | None = None,
        server_side: bool = False,
        field_manager: str | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` of YAML text, one object, or several objects."""
        if isinstance(manifests, dict):
            text = yaml.safe_dump(manifests)
        elif isinstance(manifests, str):
            text = manifests
        else:
            text = yaml.safe_dump_all(list(manifests))
        args = ["apply", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        if server_side:
            args.append("--server-side")
        if field_manager:
            args.append(f"--field-manager={field_manager}")
        return self.kubectl(*args, input=text, check=check)

    def api_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` for this cluster (admin credentials)."""
        from kubernetes import config  # the operator extra; imported only when asked for

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def log_tails(self, lines: int = 60) -> str:
        """The last `lines` of every component's log, with the full logs' paths."""
        parts = []
        for name in (*COMPONENTS, *self.serving_nodes):
            path = self.logs_dir / f"{name}.log"
            parts.append(f"===== {name} ({path}) =====\n{_tail(path, lines)}")
        return "\n".join(parts)

    # ----- internals

    def _run_tool(
        self, tool: str, args: Iterable[str], input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / tool), *args]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise KubectlError([tool, *args], result)
        return result

    def _save_state(self) -> None:
        self._state_file.write_text(json.dumps(self._state, indent=2))

    def _launch(self, name: str, args: list[str]) -> None:
        exe = str(self.bin_dir / name)
        child = self._spawn(name, exe, args)
        self._state["processes"][name] = {"pid": child.pid, "exe": exe}
        self._save_state()

    def _spawn(self, name: str, exe: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs_dir / f"{name}.log").open("ab")
        # A session of its own: `make cluster` exits and leaves the components running, and a
        # Ctrl-C in the terminal does not reach them; `stop()` ends them by pid.
        child = subprocess.Popen(
            [exe, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.state_dir,
        )
        log.close()
        self._children[name] = child
        return child

    def _check_children(self) -> None:
        for name, child in self._children.items():
            if child.poll() is not None:
                raise ClusterError(f"{name} exited with code {child.returncode}")

    def _ssl_context(self) -> ssl.SSLContext:
        pki = self.state_dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return context

    def _http_ok(self, url: str) -> bool:
        self._check_children()
        context = None
        if url.startswith("https:"):
            # The scheduler serves a self-signed certificate of its own.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status == 200

    def _api_get(self, path: str) -> Any:
        with urllib.request.urlopen(
            f"{self.server}{path}", timeout=5, context=self._ssl_context()
        ) as response:
            return json.loads(response.read() or b"null")

    def _api_ok(self, path: str) -> bool:
        self._check_children()
        try:
            with urllib.request.urlopen(
                f"{self.server}{path}", timeout=5, context=self._ssl_context()
            ) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    def _nodes_ready(self) -> bool:
        return set(self.nodes) <= self._ready_nodes()

    def _ready_nodes(self) -> set[str]:
        self._check_children()
        return {
            item["metadata"]["name"]
            for item in self._api_get("/api/v1/nodes")["items"]
            for cond in item.get("status", {}).get("conditions", [])
            if cond["type"] == "Ready" and cond["status"] == "True"
        }

    def _node_manifests(self) -> list[dict]:
        template = NODE_MANIFEST.read_text()
        return [yaml.safe_load(template.replace("NODE_NAME", name)) for name in self.nodes]

    def _write_pki_and_kubeconfigs(self, ports: _Ports) -> None:
        pki = ClusterPKI(self.state_dir / "pki")
        service_ip = SERVICE_CIDR.split("/")[0].rsplit(".", 1)[0] + ".1"
        pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns_names=APISERVER_DNS_NAMES,
            ip_addresses=("127.0.0.1", service_ip),
        )
        pki.service_account_keys()
        # The aggregation layer's client: the API server proxies to an extension API server
        # (KEDA's metrics API server) with this certificate and X-Remote-* headers.
        pki.issue("front-proxy-client", FRONT_PROXY_CLIENT)
        identities = {
            # Kubernetes reads the user from CN and the groups from O.
            "admin": ("kubernetes-admin", "system:masters"),
            "kube-controller-manager": ("system:kube-controller-manager", None),
            "kube-scheduler": ("system:kube-scheduler", None),
            "kwok": ("kwok-controller", "system:masters"),
        }
        for name, (user, group) in identities.items():
            pair = pki.issue(name, user, organization=group)
            target = self.kubeconfig if name == "admin" else self.state_dir / f"{name}.kubeconfig"
            self._write_kubeconfig(target, pki.ca.cert, pair.cert, pair.key, ports.apiserver)

    def _write_kubeconfig(self, path: Path, ca: Path, cert: Path, key: Path, port: int) -> None:
        def data(p: Path) -> str:
            return b64encode(p.read_bytes()).decode()

        name = "infernetes-local"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        "certificate-authority-data": data(ca),
                    },
                }
            ],
            "users": [
                {
                    "name": name,
                    "user": {
                        "client-certificate-data": data(cert),
                        "client-key-data": data(key),
                    },
                }
            ],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)

    def _etcd_args(self, ports: _Ports) -> list[str]:
        client = f"http://127.0.0.1:{ports.etcd_client}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        return [
            "--name=infernetes",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=infernetes={peer}",
            # Throwaway test data: durability is not worth an fsync per write on a shared disk.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_args(self, ports: _Ports) -> list[str]:
        pki = self.state_dir / "pki"
        return [
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints validation
            # forbids (every 10 s an error); nothing in this cluster dials the Service anyway.
            "--endpoint-reconciler-type=none",
            "--authorization-mode=RBAC",
            # The aggregation layer (extension API servers such as KEDA's metrics API server).
            # One CA for everything: the allowed name keeps other client certificates from
            # asserting a user through the headers.
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--allow-privileged=true",
            "--profiling=false",
        ]

    def _controller_manager_args(self, ports: _Ports) -> list[str]:
        pki = self.state_dir / "pki"
        return [
            f"--kubeconfig={self.state_dir / 'kube-controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={pki / 'kube-controller-manager-serving'}",
            # Signs the tokens of service accounts (their public half is on the API server).
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _scheduler_args(self, ports: _Ports) -> list[str]:
        pki = self.state_dir / "pki"
        return [
            f"--kubeconfig={self.state_dir / 'kube-scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={pki / 'kube-scheduler-serving'}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _kwok_args(self) -> list[str]:
        return [
            f"--kubeconfig={self.state_dir / 'kwok.kubeconfig'}",
            f"--config={self.bin_dir.parent / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-ip=127.0.0.1",
            "--cidr=10.244.0.1/16",
            "--node-lease-duration-seconds=40",
        ]


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build if needed, start, wait for the nodes")
    up.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="fake GPU nodes (default 2)")
    up.add_argument(
        "--serving-nodes", type=int, default=0, help="nodes whose pods run (podkubelet; root)"
    )
    sub.add_parser("down", help="stop the components by pid and remove the state directory")
    sub.add_parser("status", help="exit 0 when the cluster is running")
    logs = sub.add_parser("logs", help="print the components' logs")
    logs.add_argument("component", nargs="?", choices=COMPONENTS)
    args = parser.parse_args(argv)

    if args.command == "up":
        if args.nodes < 1:
            parser.error(f"argument --nodes: must be at least 1, got {args.nodes}")
        if args.serving_nodes < 0:
            parser.error(f"argument --serving-nodes: must be 0 or more, got {args.serving_nodes}")
        bin_dir = build_binaries()
        cluster = LocalCluster(args.state_dir, bin_dir)
        if cluster.running():
            print(f"already running; KUBECONFIG={cluster.kubeconfig}")
            return 0
        seconds = cluster.start(nodes=args.nodes)
        print(f"control plane ready in {seconds:.1f} s ({len(cluster.nodes)} fake GPU nodes)")
        if args.serving_nodes > 0:
            try:
                print(f"serving nodes: {cluster.start_serving_nodes(args.serving_nodes)}")
            except ServingNodesUnavailable as exc:
                print(f"no serving nodes: {exc}", file=sys.stderr)
                return 1
        print(f"export KUBECONFIG={cluster.kubeconfig} PATH={bin_dir}:$PATH")
        return 0
    cluster = LocalCluster(args.state_dir)
    if args.command == "down":
        cluster.stop()
        print(f"stopped; removed {cluster.state_dir}")
        return 0
    if args.command == "status":
        running = cluster.running()
        print(f"running, KUBECONFIG={cluster.kubeconfig}" if running else "not running")
        return 0 if running else 1
    for name in [args.component] if args.component else COMPONENTS:
        path = cluster.logs_dir / f"{name}.log"
        print(f"===== {name} ({path}) =====")
        print(path.read_text(errors="replace") if path.exists() else "(no log)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
