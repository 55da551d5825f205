"""The picker config the operator renders for precise prefix-cache routing is one llm-d's
inference scheduler takes: its real binary (cluster/llmd-scheduler.sh, from the Go module proxy),
started with the rendered command line, loads the config, instantiates the precise scorer and
binds its KV-events socket where the pods are told to publish; it stops only where it needs the
API server (none here). Skipped when the build's toolchain is missing; a failed build fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.picker_config import KV_EVENTS_PORT, PRECISE
from infernetes.operator.render import plan
from infernetes.operator.testing import free_port

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 120  # a ceiling for a loaded machine, never what is asserted
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:%d"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.fixture(scope="module")
def scheduler() -> Path:
    built = subprocess.run(
        [str(REPO / "cluster" / "llmd-scheduler.sh")], capture_output=True, text=True, check=False
    )
    if built.returncode == 3:
        pytest.skip(built.stderr.strip())
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip().splitlines()[-1])


def rendered_picker_args() -> list[str]:
    spec = {
        "model": "org/model",
        "servedModelName": "chat",
        "engine": {"blockSize": 32},
        "routing": {
            "scorers": [
                {"type": PRECISE, "weight": 2, "hashSeed": "7"},
                {"type": "queue-scorer", "weight": 1},
                {"type": "kv-cache-utilization-scorer", "weight": 1},
            ]
        },
    }
    facts = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])
    result = plan(spec, facts, name="svc", namespace="ns")
    (picker,) = [
        m
        for m in result.manifests
        if m["kind"] == "Deployment" and m["metadata"]["name"] == "svc-epp"
    ]
    return picker["spec"]["template"]["spec"]["containers"][0]["args"]


def test_llmds_scheduler_takes_the_rendered_precise_config(scheduler: Path, tmp_path: Path) -> None:
    events = free_port()
    # Only the host's ports differ from the pod's: the indexer's socket included.
    args = [
        arg.replace(f"tcp://*:{KV_EVENTS_PORT}", f"tcp://*:{events}")
        for arg in rendered_picker_args()
    ]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG % free_port())  # nothing listens: the run ends there
    env = {
        **os.environ,
        "NAMESPACE": "ns",
        "POD_NAME": "svc-epp-local",
        "PYTHONPATH": str(scheduler.parent / "python"),
    }
    result = subprocess.run(
        [
            str(scheduler),
            *args,
            f"--kubeconfig={kubeconfig}",
            f"--grpc-port={free_port()}",
            f"--grpc-health-port={free_port()}",
            f"--metrics-port={free_port()}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE_S,
        check=False,
    )
    log = result.stdout + result.stderr
    assert "loaded configuration from file/text successfully" in log, log[-4000:]
    assert '"msg":"NewKVCacheIndexer config","blockSize":32' in log, log[-4000:]
    assert '\\"enableMetrics\\":true' in log, log[-4000:]
    # The events socket as configured (it binds in a goroutine that the run may end before: the
    # bind itself is not awaited).
    assert f'\\"zmqEndpoint\\":\\"tcp://*:{events}\\"' in log, log[-4000:]
    # It went on until it needed the API server (unreachable here), not beyond.
    assert result.returncode != 0 and "controller manager" in log, log[-4000:]
