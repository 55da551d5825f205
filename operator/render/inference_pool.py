"""spec.routing -> an InferencePool and the endpoint picker (EPP) a Gateway consults for it.

The Gateway API Inference Extension (inference.networking.k8s.io/v1) routes a Gateway's HTTPRoute
to an InferencePool: the pool selects the model servers' pods and names an endpoint picker, an
ext-proc gRPC service that picks one pod per request from the metrics it scrapes off each pod
(queue depth, KV-cache usage, LoRA adapters, the cache's block size for its prefix index). The
picker is the extension's own image, run here as one Deployment (the extension recommends one
replica: its prefix index is in memory) with a Service, a ServiceAccount and a Role to read the
pool and its pods. Its metrics endpoint runs without authentication, so no ClusterRole is needed.

The pool selects the same pods as the InferenceService's Service (the leaders only, when a replica
spans nodes). The picker's pods carry labels of their own, so neither the Service nor the
InferenceService's status counts them.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from infernetes.operator import names
from infernetes.operator.facts import GATEWAY_GV, INFERENCE_POOL_GV, MODEL_REWRITE_GV, ClusterFacts
from infernetes.operator.picker_config import (
    DEFAULT_EPP_IMAGE,
    KV_EVENTS_PORT,
    KV_EVENTS_PORT_NAME,
    LLMD_SCHEDULER_IMAGE,
    flow_control,
    picker_config,
    precise_scorer,
    scorers,
    uses_llmd_scheduler,
)
from infernetes.operator.render.http_route import ROUTE_KIND, gateways, http_route
from infernetes.operator.render.picker_metrics import (
    METRICS_PORT,
    METRICS_PORT_NAME,
    METRICS_SERVICE_PORT_NAME,
    PICKER_LABEL,
    demand_query,
    picker_pod_labels,
    picker_scrape,
)
from infernetes.operator.render.traffic_split import (
    REWRITE_KIND,
    describe,
    model_rewrite,
    split_models,
)
from infernetes.operator.status import Verdict

POOL_KIND = "InferencePool"
POOL_GROUP = INFERENCE_POOL_GV.split("/")[0]
# InferenceObjectives and InferenceModelRewrites, read by the picker.
OBJECTIVE_GROUP = MODEL_REWRITE_GV.split("/")[0]
GRPC_PORT, HEALTH_PORT = 9002, 9003
# What llm-d's scheduler (v0.4.0, on the extension's v1.2.0 picker) reads from each pod, under
# vLLM's current names; its default for the KV cache is an older one. The extension's v1.5.0
# picker has no such flags: it reads these four names by default.
PICKER_METRICS = {
    "--total-queued-requests-metric": "vllm:num_requests_waiting",
    "--kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "--lora-info-metric": "vllm:lora_requests_info",
    "--cache-info-metric": "vllm:cache_config_info",
}


@dataclass
class Routing:
    manifests: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None  # None: spec.routing is not set
    # PromQL: 1 while the picker sees requests, else 0 (None: no picker, or it is not scraped).
    demand: str | None = None
    # spec.routing.splits as rendered (status.trafficSplit); empty without a rendered split.
    split: list[dict[str, Any]] = field(default_factory=list)
    # What the picker does with a request no pod can take (hold it, or refuse it), for status.
    at_zero: str = ""


def picker_name(name: str) -> str:
    return f"{name}-epp"


def inference_pool(
    routing: Mapping[str, Any], *, name: str, namespace: str, pod_selector: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_POOL_GV,
        "kind": POOL_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": names.common_labels(name)},
        "spec": {
            "selector": {"matchLabels": dict(pod_selector)},
            "targetPorts": [{"number": names.SERVER_PORT}],
            "endpointPickerRef": {
                "name": picker_name(name),
                "port": {"number": GRPC_PORT},
                "failureMode": routing.get("failureMode", "FailClose"),
            },
        },
    }


def routing_rendered(spec: Mapping[str, Any], facts: ClusterFacts) -> bool:
    """Whether the pool and its picker are rendered: routing is set and the API is served."""
    return spec.get("routing") is not None and facts.serves(INFERENCE_POOL_GV, POOL_KIND)


def _picker_args(spec: Mapping[str, Any], name: str, namespace: str) -> list[str]:
    args = [
        f"--pool-name={name}",
        f"--pool-namespace={namespace}",
        f"--pool-group={POOL_GROUP}",
        f"--config-text={yaml.safe_dump(picker_config(spec), sort_keys=False)}",
        *(
            f"{flag}={metric}"
            for flag, metric in PICKER_METRICS.items()
            if uses_llmd_scheduler(spec)
        ),
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--zap-encoder=json",
    ]
    return args


def _grpc_probe(period: int) -> dict[str, Any]:
    return {
        "grpc": {"port": HEALTH_PORT, "service": "inference-extension"},
        "periodSeconds": period,
    }


def default_picker_image(spec: Mapping[str, Any]) -> str:
    """The extension's picker, or llm-d's inference scheduler when a scorer is llm-d's or a
    prefill role needs its P/D plugins."""
    return LLMD_SCHEDULER_IMAGE if uses_llmd_scheduler(spec) else DEFAULT_EPP_IMAGE


def picker_deployment(
    spec: Mapping[str, Any],
    *,
    name: str,
    namespace: str,
    pod_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    routing = spec["routing"]
    picker = routing.get("endpointPicker") or {}
    ports = [
        {"name": "grpc", "containerPort": GRPC_PORT},
        {"name": "grpc-health", "containerPort": HEALTH_PORT},
        {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT},
    ]
    if precise_scorer(routing):
        ports.append({"name": KV_EVENTS_PORT_NAME, "containerPort": KV_EVENTS_PORT})
    container: dict[str, Any] = {
        "name": "epp",
        "image": picker.get("image", default_picker_image(spec)),
        "args": _picker_args(spec, name, namespace),
        "ports": ports,
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "livenessProbe": {**_grpc_probe(10), "initialDelaySeconds": 5},
        "readinessProbe": _grpc_probe(2),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
    }
    if picker.get("resources"):
        container["resources"] = picker["resources"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": picker_name(name),
            "namespace": namespace,
            "labels": names.common_labels(name),
        },
        "spec": {
            "replicas": 1,
            # The old picker goes before the new one starts: one prefix index at a time.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": picker_pod_labels(name)},
            "template": {
                "metadata": {
                    "labels": picker_pod_labels(name),
                    **({"annotations": dict(pod_annotations)} if pod_annotations else {}),
                },
                "spec": {
                    "serviceAccountName": picker_name(name),
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                },
            },
        },
    }


def picker_service(routing: Mapping[str, Any], *, name: str, namespace: str) -> dict[str, Any]:
    ports: list[dict[str, Any]] = [
        {"name": "grpc-ext-proc", "port": GRPC_PORT, "appProtocol": "http2"},
        {"name": METRICS_SERVICE_PORT_NAME, "port": METRICS_PORT},
    ]
    if precise_scorer(routing):
        # Where the serving pods publish their KV events (the indexer's ZMQ SUB socket binds).
        ports.append({"name": KV_EVENTS_PORT_NAME, "port": KV_EVENTS_PORT, "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": picker_name(name),
            "namespace": namespace,
            # Its own label too: the picker's ServiceMonitor selects it and not the engine's.
            "labels": {**names.common_labels(name), PICKER_LABEL: name},
        },
        "spec": {
            "selector": picker_pod_labels(name),
            "ports": ports,
        },
    }


def picker_access(*, name: str, namespace: str) -> list[dict[str, Any]]:
    """The picker's ServiceAccount and what it may read: its pool, objectives and pods."""
    metadata = {
        "name": picker_name(name),
        "namespace": namespace,
        "labels": names.common_labels(name),
    }
    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(metadata)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(metadata),
            "rules": [
                {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
                {
                    "apiGroups": [OBJECTIVE_GROUP],
                    "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                    "verbs": read,
                },
                {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(metadata),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": picker_name(name),
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": picker_name(name), "namespace": namespace}
            ],
        },
    ]


def routing_manifests(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    *,
    name: str,
    namespace: str,
    pod_selector: Mapping[str, str],
    served_name: str,
    scrape_mode: str = "none",
) -> Routing:
    """The pool and its picker when spec.routing is set and the cluster serves the pool's API;
    with routing.gateway, the HTTPRoute to the pool too, once the cluster serves HTTPRoutes;
    with routing.splits, the InferenceModelRewrite of the split, once the cluster serves it."""
    routing = spec.get("routing")
    if routing is None:
        return Routing()
    if not facts.serves(INFERENCE_POOL_GV, POOL_KIND):
        return Routing(
            [],
            (
                "False",
                "InferencePoolMissing",
                f"routing is set but the cluster does not serve {INFERENCE_POOL_GV} "
                f"{POOL_KIND}: install the Gateway API Inference Extension's CRDs; the "
                "Service serves meanwhile",
            ),
        )
    monitoring = spec.get("monitoring") or {}
    monitors, annotations = picker_scrape(
        scrape_mode, monitoring, name=name, namespace=namespace, picker=picker_name(name)
    )
    picker = picker_deployment(spec, name=name, namespace=namespace, pod_annotations=annotations)
    manifests = [
        inference_pool(routing, name=name, namespace=namespace, pod_selector=pod_selector),
        *picker_access(name=name, namespace=namespace),
        picker,
        picker_service(routing, name=name, namespace=namespace),
        *monitors,
    ]
    demand = None
    if scrape_mode != "none":
        interval = monitoring.get("interval", "30s")
        demand = demand_query(name=name, namespace=namespace, interval=interval)
    image = picker["spec"]["template"]["spec"]["containers"][0]["image"]
    served = (
        f"InferencePool {name} selects the serving pods on port {names.SERVER_PORT}; its "
        f"endpoint picker {picker_name(name)} ({image}) picks by "
        + ", ".join(f"{item['type']} {item['weight']}" for item in scorers(routing))
    )
    result = Routing(manifests, None, demand, at_zero=_at_zero(spec))
    if routing.get("splits"):
        if not facts.serves(MODEL_REWRITE_GV, REWRITE_KIND):
            result.verdict = (
                "False",
                "InferenceModelRewriteMissing",
                f"routing.splits is set but the cluster does not serve {MODEL_REWRITE_GV} "
                f"{REWRITE_KIND}: install the Gateway API Inference Extension's CRDs (v1.3 or "
                f"later); every request for {served_name} goes to {served_name}; {served}",
            )
            return result
        manifests.append(
            model_rewrite(routing, name=name, namespace=namespace, served_name=served_name)
        )
        result.split = split_models(routing, name=name, served_name=served_name)
        served += f"; {REWRITE_KIND} {name} splits the requests for {served_name}: " + describe(
            result.split
        )
    gateway = routing.get("gateway")
    if gateway is None:
        result.verdict = ("True", POOL_KIND, served)
    elif not facts.serves(GATEWAY_GV, ROUTE_KIND):
        result.verdict = (
            "False",
            "HTTPRouteMissing",
            f"routing.gateway is set but the cluster does not serve {GATEWAY_GV} "
            f"{ROUTE_KIND}: install the Gateway API's CRDs; {served}, but no route from "
            "a Gateway reaches it",
        )
    else:
        manifests.append(
            http_route(
                gateway, name=name, namespace=namespace, pool_group=POOL_GROUP, pool_kind=POOL_KIND
            )
        )
        result.verdict = (
            "True",
            ROUTE_KIND,
            f"HTTPRoute {name} attaches the pool to Gateway {gateways(gateway, namespace)}; "
            f"{served}",
        )
    return result


def _at_zero(spec: Mapping[str, Any]) -> str:
    """What the picker does with a request while no pod can take it (none ready, or all
    saturated), as status says it."""
    held = flow_control(spec)
    if held is None:
        return "the endpoint picker refuses requests while no pod is ready (503)"
    return (
        f"the endpoint picker's flow control holds requests while no pod can take them, up to "
        f"{held['holdSeconds']} s and {held['maxHeldRequests']} requests, then refuses them "
        "(503 after the wait, 429 over the bound)"
    )
