"""Which optional APIs the cluster serves (asked at start-up, when their CRDs change and every
minute: reconciler.py)."""

from typing import Any

from infernetes.operator.facts import (
    GATEWAY_GV,
    INFERENCE_POOL_GV,
    KEDA_GV,
    LWS_GV,
    MONITORING_GV,
)
from infernetes.operator.kube import KubeError, request

OPTIONAL_GROUP_VERSIONS = (MONITORING_GV, KEDA_GV, LWS_GV, INFERENCE_POOL_GV, GATEWAY_GV)
OPTIONAL_GROUPS = frozenset(gv.split("/")[0] for gv in OPTIONAL_GROUP_VERSIONS)


def discover_apis(api: Any) -> frozenset[str]:
    """ "group/version/Kind" for every kind of the optional group/versions the server serves."""
    groups = request(api, "GET", "/apis") or {}
    served = {
        version["groupVersion"]
        for group in groups.get("groups", [])
        for version in group.get("versions", [])
    }
    apis: set[str] = set()
    for group_version in OPTIONAL_GROUP_VERSIONS:
        if group_version not in served:
            continue
        try:
            resources = request(api, "GET", f"/apis/{group_version}") or {}
        except KubeError:
            continue
        apis.update(
            f"{group_version}/{resource['kind']}"
            for resource in resources.get("resources", [])
            if "/" not in resource["name"]
        )
    return frozenset(apis)
