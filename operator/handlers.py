"""kopf handlers: thin glue from watch events to the reconciler (reconciler.py).

Every handler is async and only feeds the reconciler's caches and its queue; the passes run in
the reconciler's own workers, and API calls in its own thread pool, so a burst of one kind of event
never waits behind another. Only event handlers are registered: kopf keeps no handler progress,
finalizer or last-handled annotation on the resources (no writes of its own).

Watched: InferenceServices; what the operator creates (Deployments, Services, ServiceMonitors,
PodMonitors, PodDisruptionBudgets, ScaledObjects, HorizontalPodAutoscalers, LeaderWorkerSets, and
a ResourceClaimTemplate for GPUs through DRA, for routing an InferencePool, the HTTPRoute to it, the InferenceModelRewrite of its traffic split and its endpoint picker's ServiceAccount, Role and RoleBinding, by
the managed-by label); pods (status, and GPU headroom) and nodes (GPU headroom); CRDs of the optional API groups (their appearance and removal, re-discovered).
"""

import logging
from collections.abc import Mapping
from typing import Any

import kopf
from infernetes.operator import metrics, names
from infernetes.operator.cache import plain
from infernetes.operator.discovery import OPTIONAL_GROUPS
from infernetes.operator.kube import make_client
from infernetes.operator.reconciler import Reconciler

OWNED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
OWNED_SELECTOR = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
CHILD_RESOURCES = [
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
    ("monitoring.coreos.com", "v1", "podmonitors"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("keda.sh", "v1alpha1", "scaledobjects"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    ("inference.networking.k8s.io", "v1", "inferencepools"),
    ("gateway.networking.k8s.io", "v1", "httproutes"),
    ("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites"),
    ("", "v1", "serviceaccounts"),
    ("batch", "v1", "jobs"),
    ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
]


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds every event's "essence" (a deep copy of the whole body, some milliseconds for
    a Deployment) to diff it for create/update handlers. There are none here, only event
    handlers, so there is nothing to diff and nothing to copy."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    options = memo.options
    # kopf's own log lines become events only when they matter; ours are posted explicitly.
    settings.posting.level = logging.WARNING
    # A line per watch event ("Handler 'pod_event' succeeded") would drown the reconciler's.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = 300
    settings.persistence.diffbase_storage = NoDiffBase(prefix=names.GROUP)
    # Watch scopes the API server applies: what the operator made, by its label; pods that may
    # hold GPUs (not finished ones).
    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = OWNED_SELECTOR
    settings.watching.field_selectors["", "v1", "pods"] = (
        "status.phase!=Succeeded,status.phase!=Failed"
    )
    memo.reconciler = Reconciler(
        make_client(),
        default_image=options.image,
        otlp_traces_endpoint=options.otlp_traces_endpoint,
    )
    await memo.reconciler.start()
    if options.metrics_port:
        metrics.serve_metrics(options.metrics_port, options.bind_address)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    await memo.reconciler.stop()
    memo.reconciler.api.close()


@kopf.on.probe(id="optionalApis")
def optional_apis(memo: kopf.Memo, **_: Any) -> list[str]:
    return sorted(memo.reconciler.served.apis)


@kopf.on.event(names.GROUP, names.VERSION, names.PLURAL)
async def resource_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.resource_event(type, plain(body))


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
@kopf.on.event("", "v1", "services", labels=OWNED)
@kopf.on.event("monitoring.coreos.com", "v1", "servicemonitors", labels=OWNED)
@kopf.on.event("monitoring.coreos.com", "v1", "podmonitors", labels=OWNED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=OWNED)
@kopf.on.event("keda.sh", "v1alpha1", "scaledobjects", labels=OWNED)
@kopf.on.event("autoscaling", "v2", "horizontalpodautoscalers", labels=OWNED)
@kopf.on.event("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", labels=OWNED)
@kopf.on.event("inference.networking.k8s.io", "v1", "inferencepools", labels=OWNED)
@kopf.on.event("gateway.networking.k8s.io", "v1", "httproutes", labels=OWNED)
@kopf.on.event("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites", labels=OWNED)
@kopf.on.event("", "v1", "serviceaccounts", labels=OWNED)
@kopf.on.event("batch", "v1", "jobs", labels=OWNED)
@kopf.on.event("resource.k8s.io", "v1", "resourceclaimtemplates", labels=OWNED)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=OWNED)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=OWNED)
async def child_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.child_event(type, plain(body))


# Pods and nodes are only read from (cache.py keeps summaries): no copy of the whole body.
@kopf.on.event("", "v1", "pods")
async def pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.pod_event(type, body)


@kopf.on.event("", "v1", "nodes")
async def node_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.node_event(type, body)


def _optional_group(spec: Mapping, **_: Any) -> bool:
    return spec.get("group") in OPTIONAL_GROUPS


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", when=_optional_group)
async def crd_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.served.crd_event(type, plain(body))
