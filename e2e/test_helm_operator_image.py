"""The operator image, not just the source tree: its entrypoint, run from the image's root
filesystem as uid 1001 with the chart's least-privilege RBAC, reconciles an example from
examples/ on the local control plane until the InferenceService is Ready.

Builds the operator image like tests/images does (cached by podman after the first build);
skipped where podman or root is missing, with the reason."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import install_crds, service_account_kubeconfig
from localcluster import wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "images"))
from imagetools import ImageRoot, build, missing_prerequisite  # noqa: E402

pytestmark = pytest.mark.skipif(
    missing_prerequisite() is not None, reason=str(missing_prerequisite())
)


def test_operator_image_reconciles_an_example(cluster: Any, namespace: str, tmp_path: Path):
    install_crds(cluster.kubectl)
    root = ImageRoot(build("operator"))
    process = None
    try:
        kubeconfig = service_account_kubeconfig(
            cluster.kubectl,
            namespace=namespace,
            path=tmp_path / "kubeconfig",
            service_account=f"op-{uuid.uuid4().hex[:5]}",
        )
        (root.path / "tmp" / "kubeconfig").write_text(kubeconfig.read_text())
        (root.path / "tmp" / "kubeconfig").chmod(0o644)
        log = (tmp_path / "operator.log").open("w")
        argv = [
            *root.config["Entrypoint"],
            "--standalone",
            "-n",
            namespace,
            "--metrics-port=0",
            "--health-port=0",
        ]
        process = subprocess.Popen(
            root.command(argv, env={"KUBECONFIG": "/tmp/kubeconfig"}),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        cluster.kubectl(
            "apply", "-n", namespace, "-f", str(REPO_ROOT / "examples" / "cpu-tiny.yaml")
        )

        def ready() -> Any:
            resource = yaml.safe_load(
                cluster.kubectl("get", "infsvc", "qwen-cpu", "-n", namespace, "-o", "yaml").stdout
            )
            conditions = {
                c["type"]: c["status"]
                for c in (resource.get("status") or {}).get("conditions") or []
            }
            return resource if conditions.get("Ready") == "True" else None

        try:
            resource = wait_for(
                ready, timeout=120, what="qwen-cpu Ready, reconciled by the operator image"
            )
        except Exception:
            log.flush()
            print((tmp_path / "operator.log").read_text()[-5000:])
            raise
        assert resource["status"]["url"] == f"http://qwen-cpu.{namespace}.svc:8000/v1"
        deployment = cluster.kubectl_json("get", "deployment", "qwen-cpu", "-n", namespace)
        assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == [
            "infernetes",
            "serve",
        ]
        assert process.poll() is None, "the operator exited"
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
        root.close()
