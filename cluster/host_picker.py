"""An endpoint picker run on this machine against an InferencePool of serving pods, and asked as
Envoy asks it (ext-proc, through `epp-pick --lines`). Test infrastructure: the e2e tests and
`bench prefix_routing` use it.

The picker runs with the command line the operator rendered for its Deployment; only what is the
host's differs: its listening ports, a kubeconfig where the pod would use its service account,
and, for llm-d's scheduler, where it finds tokenizers (LOCAL_TOKENIZER_DIR: `<dir>/<model
name>/tokenizer.json`, where its pod would fetch them from the Hugging Face Hub). The pods reach
it at their node's address: its Service is annotated for podkubelet's hosts file
(`HOST_BACKEND_ANNOTATION`, cluster/README.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from infernetes.operator.picker_config import KV_EVENTS_PORT, KV_EVENTS_PORT_NAME
from infernetes.operator.testing import (
    free_port,
    kubectl_get,
    running_operator,
    service_condition,
    wait_until,
)

CLUSTER_DIR = Path(__file__).resolve().parent
# podkubelet resolves a Service annotated so to the pod's host address (hosts.go).
HOST_BACKEND_ANNOTATION = {"podkubelet.infernetes.io/backend": "host"}


class PickerUnavailable(RuntimeError):
    """A picker's build needs a toolchain this machine lacks (its script exits 3): skip."""


def build(script: str) -> Path:
    """Runs a cluster/ build script (a no-op when cached) and returns the binary it names."""
    result = subprocess.run(
        [str(CLUSTER_DIR / script)], capture_output=True, text=True, check=False
    )
    if result.returncode == 3:
        raise PickerUnavailable(result.stderr.strip())
    if result.returncode != 0:
        raise RuntimeError(f"cluster/{script} failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def local_tokenizers(directory: Path, models: dict[str, Path]) -> Path:
    """A LOCAL_TOKENIZER_DIR for llm-d's scheduler: `<model name>/tokenizer.json` links."""
    for name, model_dir in models.items():
        (directory / name).mkdir(parents=True, exist_ok=True)
        link = directory / name / "tokenizer.json"
        link.unlink(missing_ok=True)
        link.symlink_to(model_dir / "tokenizer.json")
    return directory


class HostPicker:
    """The picker binary with the rendered `args`, and an ext-proc client that asks it."""

    def __init__(
        self,
        binary: Path,
        args: list[str],
        *,
        kubeconfig: Path,
        namespace: str,
        log: Path,
        env: dict[str, str] | None = None,
        answer_within: float = 10,
        header: str | None = None,
    ) -> None:
        """`header`: a request header the picker sets beside the endpoint (llm-d's
        x-prefiller-host-port), answered by `pick` after the endpoint and a space."""
        self.grpc_port, self.metrics_port = free_port(), free_port()
        self.header = header
        command = [
            str(binary),
            *args,
            f"--grpc-port={self.grpc_port}",
            f"--grpc-health-port={free_port()}",
            f"--metrics-port={self.metrics_port}",
        ]
        environment = {
            **os.environ,
            # controller-runtime's own variable: the extension's v1.5.0 picker has no flag for it.
            "KUBECONFIG": str(kubeconfig),
            "NAMESPACE": namespace,
            "POD_NAME": f"{namespace}-picker-on-host",
            **(env or {}),
        }
        self.log = log
        # How long a client waits for the picker's answer (longer than a request it holds).
        self.answer_within = answer_within
        with log.open("w") as out:
            self.process = subprocess.Popen(
                command, env=environment, stdout=out, stderr=subprocess.STDOUT
            )
        # Idle ext-proc clients: a pick takes one (or starts one), so picks run concurrently,
        # as Envoy's streams do.
        self._idle: queue.SimpleQueue[subprocess.Popen[str]] = queue.SimpleQueue()
        self._clients: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()

    def kv_events_bound(self) -> bool:
        """Whether llm-d's KV-events subscriber has bound its port (the host's 5557, where the
        pods publish): until then their events are lost, and while another picker on this
        machine holds the port they go there (llm-d's subscriber retries every 5 s)."""
        return "Bound subscriber socket" in self.log.read_text(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def _take_client(self) -> subprocess.Popen[str]:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        epp_pick = build("epp.sh").with_name("epp-pick")
        client = subprocess.Popen(
            [
                str(epp_pick),
                f"--addr=127.0.0.1:{self.grpc_port}",
                "--lines",
                "--with-body",
                f"--timeout={self.answer_within}s",
                *([f"--header={self.header}"] if self.header else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        with self._lock:
            self._clients.append(client)
        return client

    def route(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the picker answered for a completion with this body: `endpoint` (`ip:port`) and
        `body` (the JSON it forwards there, rewritten as it rewrites it), `header` (with
        `header`: the value it set, `-` when unset), or `error` (not ready yet, no endpoints, a
        refusal with its status and message, ...)."""
        if self.process.poll() is not None:
            raise RuntimeError(f"the picker exited:\n{self.log_tail()}")
        client = self._take_client()
        stdin: IO[str] = client.stdin  # type: ignore[assignment]
        stdout: IO[str] = client.stdout  # type: ignore[assignment]
        stdin.write(json.dumps(body) + "\n")
        stdin.flush()
        answer = stdout.readline().strip()
        self._idle.put(client)
        return json.loads(answer) if answer else {"error": "epp-pick gave no answer"}

    def pick(self, body: dict[str, Any]) -> str | None:
        """The endpoint (`ip:port`) the picker chose for a completion with this body (with
        `header`, then a space and that header's value, `-` when unset), or None when it did
        not answer with one (not ready yet, no endpoints, ...)."""
        routed = self.route(body)
        endpoint = routed.get("endpoint")
        if endpoint and self.header:
            return f"{endpoint} {routed.get('header', '-')}"
        return endpoint

    def metric(self, name: str) -> float:
        """The sum of a metric's samples on the picker's metrics port (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{")
        )

    def stop(self) -> None:
        for client in self._clients:
            client.kill()
            client.wait()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def routed_service(
    cluster: Any, namespace: str, workdir: Path, name: str, spec: dict[str, Any], timeout: float
) -> Iterator[dict[str, Any]]:
    """An InferenceService with `spec` (its routing included) reconciled by an operator run on
    this machine, Ready, its picker's Service annotated for a picker run on this machine. The
    annotation comes first, on a Service the operator then applies its own fields to (another
    manager's annotation stays), so that every pod's hosts file has it from the start."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": f"{name}-epp",
                "namespace": namespace,
                "annotations": HOST_BACKEND_ANNOTATION,
            },
            "spec": {"ports": [{"name": KV_EVENTS_PORT_NAME, "port": KV_EVENTS_PORT}]},
        }
    )
    with running_operator(cluster, namespace, workdir):
        cluster.apply(
            {
                "apiVersion": "infernetes.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }
        )
        try:
            wait_until(
                lambda: (
                    service_condition(cluster, namespace, name, "Ready").get("status") == "True"
                ),
                timeout=timeout,
                what=f"{name} Ready",
            )
        except TimeoutError:
            print(cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout)
            raise
        yield kubectl_get(cluster, namespace, "infsvc", name)


def rendered_picker_args(cluster: Any, namespace: str, name: str) -> list[str]:
    """The arguments of the picker's container, as the operator rendered its Deployment."""
    deployment = kubectl_get(cluster, namespace, "deployment", f"{name}-epp")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
