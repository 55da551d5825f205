"""spec.modelCache.download -> a Job that fills the cache claim before the server's pods start.

The Job runs `infernetes download` (the files `serve` would fetch) in the runtime's image, with
the cache claim at HF_HOME and the token only from spec.hfTokenSecretRef. Its name carries a hash
of what it downloads, so a changed model (or revision, or ignored files) is a new Job; the old
one is no longer rendered and goes. Until the Job for the current model has succeeded the workload
is held: not created, or, when one serves already, left as it is (its pods keep serving the
previous model) and neither updated nor deleted.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.cache import ChildId, child_id
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render.workload import (
    CACHE_MOUNT,
    HOME_MOUNT,
    TMP_MOUNT,
    container_security_context,
    pod_security_context,
)
from infernetes.operator.status import Verdict

JOB_API = "batch/v1"
BACKOFF_LIMIT = 3


def wants_download(spec: Mapping[str, Any]) -> bool:
    return bool((spec.get("modelCache") or {}).get("download"))


def _download_args(spec: Mapping[str, Any]) -> list[str]:
    engine = spec.get("engine") or {}
    args = ["download", spec["model"]]
    if engine.get("revision"):
        args.append(f"--revision={engine['revision']}")
    if engine.get("ignorePatterns") is not None:
        patterns = engine["ignorePatterns"]
        args += ["--ignore-patterns", *([patterns] if isinstance(patterns, str) else patterns)]
    return args


def job_name(spec: Mapping[str, Any], name: str) -> str:
    digest = hashlib.sha256(json.dumps(_download_args(spec)).encode()).hexdigest()[:8]
    return f"{name}-download-{digest}"


def download_job(
    spec: Mapping[str, Any], facts: ClusterFacts, *, name: str, namespace: str
) -> dict[str, Any]:
    cache = spec["modelCache"]
    mount: dict[str, Any] = {"name": "hf-cache", "mountPath": CACHE_MOUNT}
    if cache.get("subPath"):
        mount["subPath"] = cache["subPath"]
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": CACHE_MOUNT},
        {"name": "HOME", "value": HOME_MOUNT},
    ]
    if spec.get("hfTokenSecretRef"):
        ref = spec["hfTokenSecretRef"]
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {"name": ref["name"], "key": ref.get("key", "token")}
                },
            }
        )
    container: dict[str, Any] = {
        "name": "download",
        "image": spec.get("image") or facts.default_image,
        "command": ["infernetes"],
        "args": _download_args(spec),
        "env": env,
        "volumeMounts": [
            mount,
            {"name": "tmp", "mountPath": TMP_MOUNT},
            {"name": "home", "mountPath": HOME_MOUNT},
        ],
        "securityContext": container_security_context(spec),
    }
    if spec.get("imagePullPolicy"):
        container["imagePullPolicy"] = spec["imagePullPolicy"]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": pod_security_context(spec),
        "containers": [container],
        "volumes": [
            {"name": "hf-cache", "persistentVolumeClaim": {"claimName": cache["claimName"]}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
        ],
    }
    for field in ("imagePullSecrets", "nodeSelector", "tolerations"):
        if spec.get(field):
            pod[field] = spec[field]
    return {
        "apiVersion": JOB_API,
        "kind": "Job",
        "metadata": {
            "name": job_name(spec, name),
            "namespace": namespace,
            "labels": names.common_labels(name),
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            # Not the server's pods: no instance label, so neither the Service nor status sees them.
            "template": {
                "metadata": {"labels": {names.LABEL_NAME: "infernetes-model-download"}},
                "spec": pod,
            },
        },
    }


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def download_verdict(job: Mapping[str, Any], model: str) -> Verdict:
    """The ModelCached condition for the live Job (or the Job as rendered, not created yet)."""
    name = job["metadata"]["name"]
    if _job_condition(job, "Complete"):
        return "True", "Downloaded", f"Job {name} downloaded {model} into the cache"
    failed = _job_condition(job, "Failed")
    if failed:
        message = failed.get("message") or failed.get("reason") or "failed"
        return "False", "DownloadFailed", f"Job {name} could not download {model}: {message}"
    return "False", "Downloading", f"Job {name} is downloading {model} into the cache"


def held_workloads(
    manifests: list[dict[str, Any]],
    workloads: Iterable[ChildId],
    live: Mapping[ChildId, Mapping[str, Any]],
    model: str,
) -> tuple[set[ChildId], Verdict | None]:
    """(the workloads to hold, the ModelCached condition) for a render with a download Job."""
    jobs = [m for m in manifests if m["kind"] == "Job"]
    if not jobs:
        return set(), None
    job = live.get(child_id(jobs[0])) or jobs[0]
    verdict = download_verdict(job, model)
    return (set() if verdict[0] == "True" else set(workloads)), verdict
