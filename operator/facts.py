"""ClusterFacts: what `render` needs to know about the cluster, as a plain value (no I/O here)."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from infernetes.operator.names import DEFAULT_IMAGE

MONITORING_GV = "monitoring.coreos.com/v1"
KEDA_GV = "keda.sh/v1alpha1"
LWS_GV = "leaderworkerset.x-k8s.io/v1"
INFERENCE_POOL_GV = "inference.networking.k8s.io/v1"  # the Gateway API Inference Extension
GATEWAY_GV = "gateway.networking.k8s.io/v1"  # the Gateway API (HTTPRoute)
DRA_GV = "resource.k8s.io/v1"  # Dynamic Resource Allocation (GA in Kubernetes 1.34)
# The extension's InferenceModelRewrite (weighted model-name rewrites, read by its picker).
MODEL_REWRITE_GV = "inference.networking.x-k8s.io/v1alpha2"
# Kinds a bare group/version stands for (like `helm template --api-versions`).
KNOWN_KINDS = {
    MONITORING_GV: ("ServiceMonitor", "PodMonitor"),
    KEDA_GV: ("ScaledObject",),
    LWS_GV: ("LeaderWorkerSet",),
    INFERENCE_POOL_GV: ("InferencePool",),
    GATEWAY_GV: ("HTTPRoute",),
    DRA_GV: ("ResourceClaimTemplate",),
    MODEL_REWRITE_GV: ("InferenceModelRewrite",),
}


@dataclass(frozen=True)
class ClusterFacts:
    """Optional APIs the cluster serves and the GPU headroom a rolling update could use.

    `apis` holds "group/version/Kind" entries. `spare_gpus` maps a device-plugin resource
    (nvidia.com/gpu) to the most GPUs free on any one node; None means unknown. `gpus_per_node`
    maps it to the GPUs of the largest node (whether a replica must span nodes).
    `otlp_traces_endpoint` is the operator's default for spec.engine.otlpTracesEndpoint.
    """

    apis: frozenset[str] = frozenset()
    spare_gpus: Mapping[str, int] | None = None
    gpus_per_node: Mapping[str, int] | None = None
    default_image: str = DEFAULT_IMAGE
    otlp_traces_endpoint: str | None = None

    def serves(self, group_version: str, kind: str) -> bool:
        return f"{group_version}/{kind}" in self.apis

    @classmethod
    def from_api_versions(
        cls, entries: Iterable[str], spare_gpus: Mapping[str, int] | None = None
    ) -> "ClusterFacts":
        """Build from `--api-versions` entries: "group/version" or "group/version/Kind"."""
        apis: set[str] = set()
        for entry in entries:
            entry = entry.strip()
            if not entry:
                continue
            parts = entry.split("/")
            if len(parts) == 3 and all(parts):
                apis.add(entry)
            elif len(parts) == 2 and all(parts):
                apis.update(f"{entry}/{kind}" for kind in KNOWN_KINDS.get(entry, ()))
            else:
                raise ValueError(
                    f"--api-versions: expected group/version or group/version/Kind, got {entry!r}"
                )
        return cls(apis=frozenset(apis), spare_gpus=spare_gpus)
