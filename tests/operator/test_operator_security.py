"""Security by default: the rendered pods pass the restricted Pod Security Standard as rendered,
with writable volumes wherever the runtime writes; spec.podSecurityContext / spec.securityContext
merge over that, and spec.imagePullSecrets reach the pod."""

import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from infernetes.operator import names
from infernetes.operator.crd import build_crd
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import render

SAMPLES = Path(__file__).parent / "samples"
# The volume types the restricted profile admits (pod-security-standards, "Volume Types").
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def pod(spec: dict[str, Any]) -> dict[str, Any]:
    return render(spec, ClusterFacts(), name="m", namespace="ns")[0]["spec"]["template"]["spec"]


def pod_templates(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The Deployment's pod, or a LeaderWorkerSet's leader and worker pods."""
    served = ClusterFacts(apis=frozenset({"leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"}))
    workload = render(spec, served, name="m", namespace="ns")[0]
    if workload["kind"] == "LeaderWorkerSet":
        group = workload["spec"]["leaderWorkerTemplate"]
        return [group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]]
    return [workload["spec"]["template"]["spec"]]


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """What the restricted profile (v1.36) refuses in a pod spec, as rendered (the subset of its
    checks that the operator's fields can reach)."""
    out = []
    pod_context = pod_spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            out.append(field)
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {kinds}")
    if pod_context.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for container in pod_spec["containers"]:
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            out.append("privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            out.append("allowPrivilegeEscalation not false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            out.append("capabilities not dropped")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append("capabilities added")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            out.append("runAsNonRoot not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            out.append("runAsUser 0")
        seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            out.append("seccompProfile")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            out.append("hostPort")
    return out


@pytest.mark.parametrize("sample", sorted(p.stem for p in SAMPLES.glob("*.yaml")))
def test_every_sample_renders_restricted(sample: str) -> None:
    for resource in yaml.safe_load_all((SAMPLES / f"{sample}.yaml").read_text()):
        if resource["kind"] == names.KIND:
            for pod_spec in pod_templates(resource["spec"]):
                assert restricted_violations(pod_spec) == []


def test_defaults_run_as_the_image_user() -> None:
    spec = pod({"model": "x"})
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": names.RUNTIME_UID,
        "runAsGroup": names.RUNTIME_UID,
        "fsGroup": names.RUNTIME_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    assert "imagePullSecrets" not in spec


def test_runtime_uid_is_the_images() -> None:
    containerfile = (Path(__file__).parents[2] / "Containerfile").read_text()
    users = [line.split()[1] for line in containerfile.splitlines() if line.startswith("USER ")]
    assert users[-1] == str(names.RUNTIME_UID)


def writable_paths(pod_spec: dict[str, Any]) -> list[PurePosixPath]:
    volumes = {volume["name"]: volume for volume in pod_spec["volumes"]}
    out = []
    for mount in pod_spec["containers"][0]["volumeMounts"]:
        volume = volumes[mount["name"]]
        claim = volume.get("persistentVolumeClaim")
        if "emptyDir" in volume or (claim and not mount.get("readOnly") and not claim["readOnly"]):
            out.append(PurePosixPath(mount["mountPath"]))
    return out


def on_writable_volume(path: str | Path, pod_spec: dict[str, Any]) -> bool:
    return any(PurePosixPath(path).is_relative_to(root) for root in writable_paths(pod_spec))


@pytest.mark.parametrize(
    "spec",
    [
        {"model": "x"},
        {"model": "x", "engine": {"device": "cpu"}},
        {"model": "x", "modelCache": {"claimName": "hf"}},
    ],
)
def test_what_the_runtime_writes_lands_on_a_writable_volume(spec: dict[str, Any]) -> None:
    """Each cache folder the runtime resolves under the container's env is on an emptyDir or a
    writable claim: the root filesystem is read-only. Resolved in a fresh interpreter started with
    that env, as the container starts (triton reads HOME once, when it is imported)."""
    pytest.importorskip("triton")
    rendered = pod(spec)
    container = rendered["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    cleared = {
        "TMPDIR",
        "XDG_CACHE_HOME",
        "VLLM_CACHE_ROOT",
        "INFERNETES_KERNEL_CACHE",
        "TRITON_HOME",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
    }
    env = {name: value for name, value in os.environ.items() if name not in cleared}
    env.update({item["name"]: item["value"] for item in container["env"] if "value" in item})
    resolved = subprocess.run(
        [sys.executable, "-c", RESOLVE_CACHE_DIRS], env=env, capture_output=True, text=True
    )
    assert resolved.returncode == 0, resolved.stderr
    paths = json.loads(resolved.stdout)
    assert paths["HF_HOME"] == env["HF_HOME"]
    assert {
        what: path for what, path in paths.items() if not on_writable_volume(path, rendered)
    } == {}


# Where the runtime writes, as each library resolves it from the environment.
RESOLVE_CACHE_DIRS = """
import json, os, tempfile
import triton
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from infernetes.kernels.cpu import native
print(json.dumps({
    "HF_HOME": os.environ["HF_HOME"],
    "tempfile": tempfile.gettempdir(),
    "CPU kernels": str(native.cache_dir()),
    "triton": triton.knobs.cache.dir,
    "inductor": default_cache_dir(),
}))
"""


def test_overrides_merge_field_by_field() -> None:
    spec = pod(
        {
            "model": "x",
            "podSecurityContext": {
                "runAsUser": 2000,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
                "supplementalGroups": [5],
            },
            "securityContext": {
                "capabilities": {"add": ["NET_BIND_SERVICE"]},
                "readOnlyRootFilesystem": False,
            },
            "imagePullSecrets": [{"name": "registry"}],
        }
    )
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": names.RUNTIME_UID,
        "fsGroup": names.RUNTIME_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
        "supplementalGroups": [5],
    }
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "readOnlyRootFilesystem": False,
    }
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert restricted_violations(spec) == []


def test_an_override_can_leave_restricted() -> None:
    spec = pod({"model": "x", "podSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}})
    assert restricted_violations(spec) == [
        "pod runAsUser 0",
        "runAsNonRoot not true",
        "runAsUser 0",
    ]


def test_user_env_wins_over_the_writable_defaults() -> None:
    container = pod({"model": "x", "env": [{"name": "HOME", "value": "/tmp/home"}]})["containers"][
        0
    ]
    assert [item for item in container["env"] if item["name"] == "HOME"] == [
        {"name": "HOME", "value": "/tmp/home"}
    ]


def test_crd_types_the_new_fields() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    properties = spec["properties"]
    assert properties["podSecurityContext"]["properties"]["runAsUser"]["format"] == "int64"
    assert properties["podSecurityContext"]["properties"]["seccompProfile"]["required"] == ["type"]
    capabilities = properties["securityContext"]["properties"]["capabilities"]["properties"]
    assert set(capabilities) == {"add", "drop"}
    assert properties["imagePullSecrets"]["items"]["required"] == ["name"]
