"""The operator's least-privilege RBAC: exactly the verbs its handlers and kopf use."""

from typing import Any

from infernetes.operator import names
from infernetes.operator.peering import PEERING_GROUP, cluster_peering

CHILD_VERBS = ["get", "list", "watch", "create", "patch", "delete"]
READ = ["get", "list", "watch"]


def cluster_rules() -> list[dict[str, Any]]:
    return [
        # The resource itself: watched, annotated by kopf, status written by the operator.
        {"apiGroups": [names.GROUP], "resources": [names.PLURAL], "verbs": [*READ, "patch"]},
        {
            "apiGroups": [names.GROUP],
            "resources": [f"{names.PLURAL}/status"],
            "verbs": ["get", "patch"],
        },
        # What it creates (server-side apply is a patch that may create; what is no longer rendered
        # is deleted).
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": CHILD_VERBS},
        {"apiGroups": [""], "resources": ["services"], "verbs": CHILD_VERBS},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": CHILD_VERBS},
        {
            "apiGroups": ["monitoring.coreos.com"],
            "resources": ["servicemonitors", "podmonitors"],
            "verbs": CHILD_VERBS,
        },
        {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": CHILD_VERBS},
        {
            "apiGroups": ["autoscaling"],
            "resources": ["horizontalpodautoscalers"],
            "verbs": CHILD_VERBS,
        },
        {
            "apiGroups": ["leaderworkerset.x-k8s.io"],
            "resources": ["leaderworkersets"],
            "verbs": CHILD_VERBS,
        },
        # spec.routing: the InferencePool, and the endpoint picker's identity and Role. A Role
        # may grant only what its creator holds: the picker reads pools, objectives and pods.
        {
            "apiGroups": ["inference.networking.k8s.io"],
            "resources": ["inferencepools"],
            "verbs": CHILD_VERBS,
        },
        # spec.routing.gateway: the HTTPRoute from the user's Gateway to the pool.
        {
            "apiGroups": ["gateway.networking.k8s.io"],
            "resources": ["httproutes"],
            "verbs": CHILD_VERBS,
        },
        {
            "apiGroups": ["inference.networking.x-k8s.io"],
            "resources": ["inferenceobjectives"],
            "verbs": READ,
        },
        # spec.routing.splits: the InferenceModelRewrite the picker reads its split from.
        {
            "apiGroups": ["inference.networking.x-k8s.io"],
            "resources": ["inferencemodelrewrites"],
            "verbs": CHILD_VERBS,
        },
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": CHILD_VERBS},
        # spec.modelCache.download: the Job that fills the cache before the server starts.
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": CHILD_VERBS},
        # spec.gpu.deviceClassName: the ResourceClaimTemplate each pod's GPU claim is made from.
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates"],
            "verbs": CHILD_VERBS,
        },
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["roles", "rolebindings"],
            "verbs": CHILD_VERBS,
        },
        # Read-only views for status (pods) and for GPU headroom (nodes, pods).
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": READ},
        # The access modes of the claims a resource mounts (ClaimsShared).
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]},
        # Events for the user, and kopf's own bookkeeping.
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
        {
            "apiGroups": [PEERING_GROUP],
            "resources": ["clusterkopfpeerings", "kopfpeerings"],
            "verbs": ["get", "list", "watch", "patch"],
        },
    ]


def rbac_manifests(*, namespace: str, service_account: str) -> list[dict[str, Any]]:
    role_name = "infernetes-operator"
    labels = {names.LABEL_NAME: "infernetes", names.LABEL_COMPONENT: "operator"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role_name, "labels": labels},
            "rules": cluster_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role_name, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role_name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
        cluster_peering("infernetes"),
    ]
