"""spec.modelCache.download: the Job that fills the cache, what it runs and mounts, its name
following the model, the ModelCached condition from the live Job, and the admission rules (the
e2e module proves the Job completes before the Deployment exists)."""

from typing import Any

import pytest
from infernetes.operator.crd import build_crd
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import plan
from infernetes.operator.render.model_cache import download_verdict, held_workloads

CACHE = {"claimName": "hf-cache", "subPath": "hub", "download": True}


def spec(**extra: Any) -> dict[str, Any]:
    return {"model": "org/model", "modelCache": dict(CACHE), **extra}


def job_of(body: dict) -> dict:
    (job,) = [
        m
        for m in plan(body, ClusterFacts(), name="svc", namespace="ns").manifests
        if m["kind"] == "Job"
    ]
    return job


def test_no_download_no_job() -> None:
    body = {"model": "org/model", "modelCache": {"claimName": "hf-cache"}}
    result = plan(body, ClusterFacts(), name="svc", namespace="ns")
    assert [m["kind"] for m in result.manifests] == ["Deployment", "Service"]


def test_job_downloads_into_the_claim_with_the_token_from_the_secret() -> None:
    body = spec(
        hfTokenSecretRef={"name": "hf"},
        engine={"revision": "v2", "ignorePatterns": ["*.pt"]},
    )
    job = job_of(body)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["infernetes"]
    assert container["args"] == [
        "download",
        "org/model",
        "--revision=v2",
        "--ignore-patterns",
        "*.pt",
    ]
    env = {item["name"]: item for item in container["env"]}
    assert env["HF_HOME"]["value"] == "/var/cache/huggingface"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert "value" not in env["HF_TOKEN"]
    cache = next(m for m in container["volumeMounts"] if m["name"] == "hf-cache")
    assert cache == {"name": "hf-cache", "mountPath": "/var/cache/huggingface", "subPath": "hub"}
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Not one of the server's pods: the Service and status select by the instance label.
    assert "app.kubernetes.io/instance" not in job["spec"]["template"]["metadata"]["labels"]


def test_a_changed_model_or_revision_is_a_new_job() -> None:
    first = job_of(spec())["metadata"]["name"]
    assert first.startswith("svc-download-")
    assert job_of(spec())["metadata"]["name"] == first
    assert job_of({**spec(), "model": "org/other"})["metadata"]["name"] != first
    assert job_of(spec(engine={"revision": "v2"}))["metadata"]["name"] != first
    # What does not change the download does not re-run it.
    assert job_of(spec(replicas=3))["metadata"]["name"] == first


def test_workload_held_until_the_job_completes_and_the_condition_tells() -> None:
    result = plan(spec(), ClusterFacts(), name="svc", namespace="ns")
    manifests, workloads = result.manifests, result.roles.values()
    job = manifests[-1]
    workload = ("apps/v1", "Deployment", "svc")
    job_id = ("batch/v1", "Job", job["metadata"]["name"])
    assert held_workloads(manifests, workloads, {}, "org/model") == (
        {workload},
        (
            "False",
            "Downloading",
            f"Job {job['metadata']['name']} is downloading org/model into the cache",
        ),
    )
    failed = {
        **job,
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                }
            ]
        },
    }
    held, verdict = held_workloads(manifests, workloads, {job_id: failed}, "org/model")
    assert held == {workload}
    assert verdict[:2] == ("False", "DownloadFailed") and "backoff limit" in verdict[2]
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert held_workloads(manifests, workloads, {job_id: done}, "org/model")[0] == set()
    assert download_verdict(done, "org/model")[:2] == ("True", "Downloaded")


def test_crd_documents_download_and_refuses_invalid_combinations() -> None:
    crd = build_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    cache = schema["properties"]["modelCache"]
    assert cache["properties"]["download"]["description"]
    messages = {r["message"]: r.get("fieldPath") for r in cache["x-kubernetes-validations"]}
    assert any("readOnly" in m for m in messages)
    spec_rules = {r["message"]: r.get("fieldPath") for r in schema["x-kubernetes-validations"]}
    (path,) = [p for m, p in spec_rules.items() if "pvc://" in m and "download" in m]
    assert path == ".modelCache.download"


@pytest.mark.parametrize("read_only", [False, True])
def test_triton_kernels_are_cached_on_a_writable_claim(read_only: bool) -> None:
    """The server's Triton kernels are compiled into the cache claim (a new pod finds them
    compiled); a read-only claim leaves Triton its default, the pod's writable home."""
    body = {"model": "org/model", "modelCache": {"claimName": "hf-cache", "readOnly": read_only}}
    result = plan(body, ClusterFacts(), name="svc", namespace="ns")
    (deployment,) = [m for m in result.manifests if m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    if read_only:
        assert "TRITON_CACHE_DIR" not in env
    else:
        assert env["TRITON_CACHE_DIR"] == "/var/cache/huggingface/infernetes/triton"
    assert not [
        name for name in env if name.startswith("VLLM_")
    ]  # the VLLM_* space stays the user's
