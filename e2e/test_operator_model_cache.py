"""spec.modelCache.download on the local control plane (issue 21, part 4): the operator creates
the download Job on a bound cache claim, kwok completes its pod (kwok's pod-complete stage: pods
owned by a Job succeed), the Job controller marks the Job Complete, and only then does the
Deployment exist; a changed model runs a new Job, the old one goes, and the Deployment follows
once the new Job has succeeded."""

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    OperatorProcess,
    install_crds,
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)

TIMEOUT = 90


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-model-cache") as name:
        yield name


@pytest.fixture(scope="module")
def claim(cluster: Any, ns: str) -> Iterator[str]:
    """A claim bound to a static volume (the local cluster has no provisioner), and the token."""
    volume = f"{ns}-hf-cache"
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "manual",
                "hostPath": {"path": f"/tmp/{volume}"},
                "claimRef": {"namespace": ns, "name": "hf-cache"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "hf-cache", "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "manual",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token", "namespace": ns},
        "stringData": {"token": "hf_not_a_real_token"},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*manifests, token]))
    yield "hf-cache"
    cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator-model-cache")) as process:
        yield process


def jobs(cluster: Any, ns: str) -> list[dict]:
    return (kubectl_get(cluster, ns, "jobs") or {}).get("items") or []


def cached(model: str, claim: str) -> dict:
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "cached"},
        "spec": {
            "model": model,
            "engine": {"device": "cpu"},
            "modelCache": {"claimName": claim, "download": True},
            "hfTokenSecretRef": {"name": "hf-token"},
        },
    }


def complete(job: dict) -> bool:
    return any(
        c["type"] == "Complete" and c["status"] == "True"
        for c in (job.get("status") or {}).get("conditions") or ()
    )


def test_the_download_job_completes_before_the_deployment_exists(
    cluster: Any, ns: str, claim: str, operator: OperatorProcess
) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(cached("org/first", claim)))
    wait_until(lambda: jobs(cluster, ns), timeout=TIMEOUT, what="the download Job")
    (job,) = jobs(cluster, ns)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["download", "org/first"]
    wait_until(
        lambda: kubectl_get(cluster, ns, "deployment", "cached") is not None,
        timeout=TIMEOUT,
        what="the Deployment once the Job has succeeded",
    )
    deployment = kubectl_get(cluster, ns, "deployment", "cached")
    (job,) = jobs(cluster, ns)
    assert complete(job), job.get("status")
    # RFC 3339 in UTC: the strings order as the times do.
    assert job["status"]["completionTime"] <= deployment["metadata"]["creationTimestamp"]
    wait_until(
        lambda: (
            service_condition(cluster, ns, "cached", "ModelCached").get("reason") == "Downloaded"
        ),
        timeout=TIMEOUT,
        what="ModelCached True",
    )

    first_job = job["metadata"]["name"]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(cached("org/second", claim)))

    def second_done() -> bool:
        found = jobs(cluster, ns)
        names = [j["metadata"]["name"] for j in found]
        return first_job not in names and len(found) == 1 and complete(found[0])

    wait_until(second_done, timeout=TIMEOUT, what="the new model's Job, the old one gone")
    assert kubectl_get(cluster, ns, "deployment", "cached") is not None  # served throughout

    def deployment_follows() -> bool:
        live = kubectl_get(cluster, ns, "deployment", "cached")
        args = live["spec"]["template"]["spec"]["containers"][0]["args"]
        return any("org/second" in arg for arg in args)

    wait_until(deployment_follows, timeout=TIMEOUT, what="the Deployment on the new model")


def test_invalid_download_combinations_are_refused_naming_the_field(cluster: Any, ns: str) -> None:
    install_crds(cluster.kubectl)
    cases = [
        (
            {
                "model": "org/m",
                "modelCache": {"claimName": "c", "download": True, "readOnly": True},
            },
            "spec.modelCache.download",
            "readOnly",
        ),
        (
            {"model": "pvc://models/llama", "modelCache": {"claimName": "c", "download": True}},
            "spec.modelCache.download",
            "pvc://",
        ),
    ]
    for spec, field, expected in cases:
        body = {
            "apiVersion": "infernetes.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "bad"},
            "spec": spec,
        }
        result = cluster.kubectl(
            "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body), check=False
        )
        assert result.returncode != 0, spec
        assert field in result.stderr and expected in result.stderr, result.stderr
