"""GPUs through Dynamic Resource Allocation (resource.k8s.io/v1): each pod's claim is made from a
ResourceClaimTemplate, the operator's (spec.gpu.deviceClassName: exactly the replica's GPU count
of that DeviceClass) or the user's (spec.gpu.resourceClaimTemplateName), in place of the device
plugin's `nvidia.com/gpu` count.

A template's spec cannot be changed, so the operator's is named by a digest of what it asks for:
a new count is a new template (and a rollout), and the old one is pruned.
"""

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import DRA_GV

KIND = "ResourceClaimTemplate"
CLAIM = "gpu"  # the pod's claim and the template's one request
MISSING = "DynamicResourceAllocationMissing"


def uses_dra(spec: Mapping[str, Any]) -> bool:
    gpu = spec.get("gpu") or {}
    return bool(gpu.get("deviceClassName") or gpu.get("resourceClaimTemplateName"))


def _requests(device_class: str, gpus: int) -> list[dict[str, Any]]:
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": gpus}
    return [{"name": CLAIM, "exactly": exactly}]


def template_name(spec: Mapping[str, Any], name: str, gpus: int) -> str:
    """The template the pods' claims come from (the user's, else the operator's)."""
    gpu = spec.get("gpu") or {}
    if gpu.get("resourceClaimTemplateName"):
        return gpu["resourceClaimTemplateName"]
    requests = _requests(gpu["deviceClassName"], gpus)
    digest = hashlib.sha256(json.dumps(requests, sort_keys=True).encode()).hexdigest()[:8]
    return f"{name}-gpu-{digest}"


def claim_templates(
    spec: Mapping[str, Any], *, name: str, namespace: str, gpus: int
) -> list[dict[str, Any]]:
    """The operator's template, when it renders one."""
    device_class = (spec.get("gpu") or {}).get("deviceClassName")
    if not device_class or not gpus:
        return []
    return [
        {
            "apiVersion": DRA_GV,
            "kind": KIND,
            "metadata": {
                "name": template_name(spec, name, gpus),
                "namespace": namespace,
                "labels": names.common_labels(name),
            },
            "spec": {"spec": {"devices": {"requests": _requests(device_class, gpus)}}},
        }
    ]


def pod_claims(spec: Mapping[str, Any], name: str, gpus: int) -> list[dict[str, Any]]:
    """The pod's resourceClaims; the container names CLAIM in resources.claims."""
    return [{"name": CLAIM, "resourceClaimTemplateName": template_name(spec, name, gpus)}]


def missing_api() -> tuple[str, str]:
    """The (reason, message) while the spec claims GPUs by DRA but the cluster does not serve it."""
    return (
        MISSING,
        f"spec.gpu claims GPUs through Dynamic Resource Allocation ({DRA_GV}), which the "
        "cluster does not serve (Kubernetes 1.34 and later do): request them by count instead "
        "(leave gpu.deviceClassName and gpu.resourceClaimTemplateName unset); nothing is "
        "deployed until then",
    )
