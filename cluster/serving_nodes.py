"""Serving nodes for the local control plane: nodes whose pods really run.

Each is a `podkubelet` process (cluster/podkubelet: a virtual-kubelet node whose provider runs
every container of a pod bound to it as a process, in a network namespace of its own holding the
pod IP; built by cluster/podkubelet.sh). They stand beside kwok's fake GPU nodes, labelled and
tainted `infernetes.io/serving-node=true` so that only pods which select and tolerate them land
there. `LocalCluster.start_serving_nodes()` starts them; see cluster/README.md for why this is
not a real kubelet and what it does not do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLUSTER_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = CLUSTER_DIR / "podkubelet.sh"
# The label and taint that keep every other pod off these nodes.
SERVING_NODE_LABEL = "infernetes.io/serving-node"
# Pod subnets 10.245.N.0/24 on bridges ipkN (kwok's fake pod IPs are in 10.244.0.0/16).
POD_NETWORK_PREFIX = "10.245"
BRIDGE_PREFIX = "ipk"
MAX_BRIDGES = 250


def serving_spec(
    model: str,
    name: str,
    *,
    engine: dict[str, Any] | None = None,
    cpu: str = "500m",
    memory: str = "1Gi",
    env: tuple[dict[str, Any], ...] = (),
    **fields: Any,
) -> dict[str, Any]:
    """An InferenceService spec whose pods run on these nodes: a float32 CPU engine without CUDA
    graphs (``engine`` adds to or overrides it), offline from the Hub (the model is local),
    selecting and tolerating the serving nodes; ``fields`` add the rest of the spec."""
    return {
        "model": model,
        "servedModelName": name,
        "engine": {
            "device": "cpu",
            "maxModelLen": 128,
            "dtype": "float32",
            "enforceEager": True,
            **(engine or {}),
        },
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, *env],
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
        "nodeSelector": {SERVING_NODE_LABEL: "true"},
        "tolerations": [{"key": SERVING_NODE_LABEL, "operator": "Exists"}],
        **fields,
    }


class ServingNodesUnavailable(RuntimeError):
    """This machine cannot run serving nodes (no Go toolchain, not root, no `ip`): tests skip."""


def build_podkubelet() -> Path:
    """Runs cluster/podkubelet.sh (a no-op when cached) and returns the binary's path."""
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode == 3:
        raise ServingNodesUnavailable(f"{BUILD_SCRIPT}: no Go toolchain")
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def check_host() -> None:
    """Raises ServingNodesUnavailable unless this process may create network namespaces."""
    if os.geteuid() != 0:
        raise ServingNodesUnavailable("serving nodes create network namespaces: they need root")
    if not shutil.which("ip"):
        raise ServingNodesUnavailable("no `ip` command (Debian: iproute2)")
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode:
        raise ServingNodesUnavailable("`ip netns` does not work here (Debian: iproute2)")


def free_bridge_indexes(count: int) -> list[int]:
    """Indexes N whose bridge ipkN does not exist on this machine (another cluster's nodes may
    hold some)."""
    links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    taken = {
        name.split("@")[0]
        for line in links.splitlines()
        if len(parts := line.split(": ")) > 1
        for name in [parts[1]]
    }
    free = [n for n in range(MAX_BRIDGES) if f"{BRIDGE_PREFIX}{n}" not in taken]
    if len(free) < count:
        raise ServingNodesUnavailable(f"fewer than {count} free bridge names {BRIDGE_PREFIX}N")
    return free[:count]


def default_images() -> dict[str, Any]:
    """Every image runs with the tools of this Python's environment first on PATH (the runtime
    image's `infernetes` console script is this environment's). That environment and the code it
    imports stand for the image's files: kept visible under a volume a pod mounts above them (a
    checkout under /tmp beneath the pod's /tmp emptyDir). So does this machine's cache of the CPU
    engine's C kernels (INFERNETES_KERNEL_CACHE), as kernels built into the image: without it
    every pod compiles them into its emptyDir home as its engine starts, which took minutes of
    a busy machine's cores per pod and held rolling updates up."""
    from infernetes.kernels.cpu.native import CACHE_ENV, cache_dir

    kernels = cache_dir()
    kernels.mkdir(parents=True, exist_ok=True)
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    keep = sorted({sys.prefix, sys.base_prefix, str(CLUSTER_DIR.parent), str(kernels)})
    images: dict[str, Any] = {"*": {"env": {"PATH": path, CACHE_ENV: str(kernels)}, "keep": keep}}
    sidecar = routing_sidecar_binary()
    if sidecar is not None:
        # The decode pods' llm-d routing sidecar (spec.prefill): its image's entrypoint.
        from infernetes.operator.render.disaggregation import SIDECAR_IMAGE

        images[SIDECAR_IMAGE] = {"entrypoint": [str(sidecar)]}
    return images


def routing_sidecar_binary() -> Path | None:
    """llm-d's pd-sidecar built by cluster/pd-sidecar.sh (cached), or None without Go."""
    result = subprocess.run(
        [str(CLUSTER_DIR / "pd-sidecar.sh")], capture_output=True, text=True, check=False
    )
    if result.returncode == 3:
        return None
    if result.returncode != 0:
        raise RuntimeError(f"cluster/pd-sidecar.sh failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def interpreter_reachable_by_others() -> bool:
    """False when a directory above this Python is closed to other users (a venv under a 0700
    home): a container that asks for a non-root user could not start it."""
    path = Path(sys.executable).resolve()
    return all(os.stat(parent).st_mode & 0o001 for parent in path.parents)


def podkubelet_args(
    *,
    name: str,
    index: int,
    kubeconfig: Path,
    images: Path,
    state_dir: Path,
    log_dir: Path,
    restart_backoff: str,
) -> list[str]:
    args = [
        f"--node-name={name}",
        f"--kubeconfig={kubeconfig}",
        f"--pod-cidr={POD_NETWORK_PREFIX}.{index}.0/24",
        f"--bridge={BRIDGE_PREFIX}{index}",
        f"--images={images}",
        f"--state-dir={state_dir}",
        f"--log-dir={log_dir}",
        f"--label={SERVING_NODE_LABEL}=true",
        f"--taint={SERVING_NODE_LABEL}=true:NoSchedule",
        f"--restart-backoff={restart_backoff}",
    ]
    if not interpreter_reachable_by_others():
        args.append("--run-as-root")
    return args


def write_images(path: Path, images: dict[str, Any] | None) -> Path:
    path.write_text(json.dumps(images if images is not None else default_images(), indent=2))
    return path


def serving_pods(cluster: Any, namespace: str, instance: str) -> list[dict[str, Any]]:
    """The pods of an InferenceService that are not being deleted."""
    items = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={instance}"
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@contextlib.contextmanager
def model_claim(cluster: Any, namespace: str, model_dir: Path) -> Iterator[str]:
    """A claim named `models` in `namespace`, bound to a hostPath volume holding the model's
    parent directory: pods on serving nodes get the model as `pvc://models/<model_dir.name>`."""
    volume = f"models-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(model_dir.parent), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": "models"},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "models", "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        ]
    )
    try:
        yield "models"
    finally:
        cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)
