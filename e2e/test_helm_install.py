"""The install path on the local control plane: `helm install` brings the CRD and the operator
(its pod reaches Running on a kwok node), InferenceServices from values are accepted, and
`helm uninstall` removes what the release created. Helm never deletes the CRDs of a chart's
crds/ folder (that would delete every InferenceService in the cluster), so the CRD stays.

kwok runs the operator's pod as a fake pod, so no image is pulled: this checks the chart's
objects against a real API server, scheduler and controllers, not the image itself (the image
tests under tests/images do that)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml
from localcluster import wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "helm" / "infernetes"
CRD = "inferenceservices.infernetes.io"


def exists(cluster: Any, *what: str) -> bool:
    return cluster.kubectl("get", *what, check=False).returncode == 0


def test_helm_install_runs_the_operator_and_uninstall_removes_it(
    cluster: Any, namespace: str, tmp_path: Path
):
    release = f"inf-{uuid.uuid4().hex[:6]}"
    peering = f"{release}-infernetes"  # default: the release's full name, unique per release
    crd_existed = exists(cluster, "crd", CRD)
    values = {
        "replicaCount": 2,
        "peering": {"enabled": True},
        "inferenceServices": [
            {
                "name": "tiny",
                "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "engine": {"device": "cpu"}},
            }
        ],
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))

    install = cluster.helm(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(values_file),
        "--wait",
        "--timeout",
        "180s",
    )
    assert "STATUS: deployed" in install.stdout
    notes = install.stdout.split("NOTES:", 1)[1]
    assert (
        f"kubectl -n {namespace} rollout status deployment/{release}-infernetes-operator" in notes
    )
    assert "kind: InferenceService" in notes and "tiny" in notes

    # The CRD: created by this release, or already there (another test applied the same one).
    crd = cluster.kubectl_json("get", "crd", CRD)
    assert any(
        c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"]
    )
    if not crd_existed:
        assert exists(cluster, "crd", "clusterkopfpeerings.kopf.dev")

    # The operator's pods run on the fake nodes, with its ServiceAccount.
    deployment = f"{release}-infernetes-operator"

    def running_pods() -> list[dict]:
        selector = f"app.kubernetes.io/instance={release}"
        items = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]
        running = [pod for pod in items if pod["status"].get("phase") == "Running"]
        return running if len(running) == 2 else []

    pods = wait_for(running_pods, timeout=120, what="both operator pods Running")
    assert {pod["spec"]["nodeName"] for pod in pods} <= set(cluster.nodes)
    assert all(pod["spec"]["serviceAccountName"] == deployment for pod in pods)
    args = pods[0]["spec"]["containers"][0]["args"]
    assert f"--peering={peering}" in args

    # What the release created is real and bound together.
    assert exists(cluster, "clusterkopfpeering", peering)
    binding = cluster.kubectl_json("get", "clusterrolebinding", deployment)
    assert binding["subjects"][0] == {
        "kind": "ServiceAccount",
        "name": deployment,
        "namespace": namespace,
    }
    can_patch = cluster.kubectl(
        "auth",
        "can-i",
        "patch",
        "inferenceservices.infernetes.io/status",
        f"--as=system:serviceaccount:{namespace}:{deployment}",
        "-A",
    )
    assert can_patch.stdout.strip() == "yes"
    cannot = cluster.kubectl(
        "auth",
        "can-i",
        "delete",
        "secrets",
        f"--as=system:serviceaccount:{namespace}:{deployment}",
        "-A",
        check=False,
    )
    assert cannot.stdout.strip() == "no"
    service = cluster.kubectl_json("get", "service", f"{deployment}-metrics", "-n", namespace)
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    tiny = cluster.kubectl_json("get", "infsvc", "tiny", "-n", namespace)
    assert tiny["spec"]["engine"] == {"device": "cpu"}

    cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
    gone = [
        ("deployment", deployment, "-n", namespace),
        ("serviceaccount", deployment, "-n", namespace),
        ("service", f"{deployment}-metrics", "-n", namespace),
        ("infsvc", "tiny", "-n", namespace),
        ("clusterrole", deployment),
        ("clusterrolebinding", deployment),
        ("clusterkopfpeering", peering),
    ]
    for what in gone:
        wait_for(
            lambda what=what: not exists(cluster, *what),
            timeout=60,
            what=f"{' '.join(what)} deleted",
        )
    assert exists(cluster, "crd", CRD)  # helm keeps crds/ on uninstall, by design
    assert (
        "release: not found" in cluster.helm("status", release, "-n", namespace, check=False).stderr
    )


def test_helm_install_watching_namespaces_binds_only_those(cluster: Any, namespace: str):
    release = f"inf-{uuid.uuid4().hex[:6]}"
    cluster.helm(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--wait",
        "--timeout",
        "180s",
    )
    try:
        account = f"system:serviceaccount:{namespace}:{release}-infernetes-operator"

        def can(verb: str, resource: str, *where: str) -> str:
            return cluster.kubectl(
                "auth", "can-i", verb, resource, f"--as={account}", *where, check=False
            ).stdout.strip()

        assert can("create", "deployments.apps", "-n", namespace) == "yes"
        assert can("create", "deployments.apps", "-n", "default") == "no"
        assert can("list", "nodes") == "yes"  # GPU headroom is cluster-wide
        assert exists(cluster, "kopfpeering", f"{release}-infernetes", "-n", namespace)
    finally:
        cluster.helm(
            "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s", check=False
        )


def test_every_rendered_object_passes_a_server_side_dry_run(cluster: Any, namespace: str):
    # --dry-run=server: the API server validates every object the chart renders (without storing).
    out = cluster.helm("install", "dry", str(CHART), "-n", namespace, "--dry-run=server").stdout
    for kind in (
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "ClusterKopfPeering",
    ):
        assert f"kind: {kind}\n" in out
