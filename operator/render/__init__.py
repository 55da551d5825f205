"""render(spec, cluster_facts): the objects one InferenceService needs, as a pure function.

No I/O: the handlers apply what this returns, the CLI prints it, golden tests compare it.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infernetes.operator import names
from infernetes.operator.cache import ChildId, child_id
from infernetes.operator.disaggregation import DECODE, PREFILL
from infernetes.operator.engine_support import review_engine
from infernetes.operator.facts import DRA_GV, LWS_GV, ClusterFacts
from infernetes.operator.multinode import LWS_KIND, missing_api
from infernetes.operator.picker_config import with_precise_routing
from infernetes.operator.render.autoscaling import autoscaler
from infernetes.operator.render.disaggregation import role_specs
from infernetes.operator.render.disruption import disruption_budget
from infernetes.operator.render.dra import KIND as CLAIM_TEMPLATE_KIND
from infernetes.operator.render.dra import claim_templates, uses_dra
from infernetes.operator.render.dra import missing_api as dra_missing_api
from infernetes.operator.render.inference_pool import (
    picker_name,
    routing_manifests,
    routing_rendered,
)
from infernetes.operator.render.leaderworkerset import (
    LEADER,
    ROLE_LABEL,
    Layout,
    layout,
    leaderworkerset_manifest,
)
from infernetes.operator.render.model_cache import download_job, wants_download
from infernetes.operator.render.monitoring import scrape_config
from infernetes.operator.render.service import service_manifest, service_name_for
from infernetes.operator.render.workload import deployment_manifest, gpus_per_replica
from infernetes.operator.render.workload import model_source as resolve_model
from infernetes.operator.status import Verdict

# The role of the workload whose pods serve the API: the one server, or with spec.prefill the
# decode role (behind it, the PREFILL role's workload).
SERVER = "server"


@dataclass
class Plan:
    """What render decided, for status as well as for apply. Its workloads (the Deployment or
    LeaderWorkerSet running the server) are named by role, never found by their position."""

    manifests: list[dict[str, Any]]
    service_name: str
    model_name: str
    url: str
    gpus_per_replica: int
    selector: str
    # What the operator adjusted, then the engine settings the runtime accepts without effect.
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # those engine settings alone
    refused: list[str] = field(default_factory=list)  # settings the CRD and the runtime refuse
    autoscaling: Verdict | None = None  # the Autoscaling condition; None without spec.autoscaling
    # spec.routing.splits as the picker applies it (status.trafficSplit); empty without one.
    traffic_split: list[dict[str, Any]] = field(default_factory=list)
    nodes_per_replica: int = 1  # more than one: a LeaderWorkerSet instead of a Deployment
    gpus_per_pod: int = 0
    # (reason, message) when the workload cannot be rendered for this cluster (no LWS API).
    blocked: tuple[str, str] | None = None
    # Conditions the render alone decides, by type (Routing: only with spec.routing).
    conditions: dict[str, Verdict] = field(default_factory=dict)
    # Children to leave as they are this pass, neither applied nor deleted (the workload while
    # the model-cache Job runs: the reconciler decides, from the live Job).
    held: set[ChildId] = field(default_factory=set)
    # Each role's workload, by the id of its manifest in `manifests` (none while `blocked`).
    roles: dict[str, ChildId] = field(default_factory=dict)

    @property
    def workloads(self) -> dict[str, dict[str, Any]]:
        """The workload manifests by role."""
        by_id = {child_id(manifest): manifest for manifest in self.manifests}
        return {role: by_id[workload] for role, workload in self.roles.items()}


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def plan(
    spec: Mapping[str, Any],
    cluster_facts: ClusterFacts,
    *,
    name: str,
    namespace: str,
    uid: str | None = None,
) -> Plan:
    """The children of one InferenceService, workloads first, and what its status says of them;
    owner references when its uid is known."""
    warnings: list[str] = []
    service_name, rename_reason = service_name_for(name)
    if rename_reason:
        warnings.append(rename_reason)
    scrape = scrape_config(spec, cluster_facts, name=name, namespace=namespace)
    warnings.extend(scrape.warnings)
    placement = layout(spec, cluster_facts)
    if routing_rendered(spec, cluster_facts):
        spec = with_precise_routing(
            spec, picker=picker_name(name), served_name=resolve_model(spec).served_name
        )
    workloads, blocked = _workloads(
        spec,
        cluster_facts,
        placement,
        name=name,
        namespace=namespace,
        pod_annotations=scrape.pod_annotations,
    )
    service = service_manifest(spec, name=name, namespace=namespace, service_name=service_name)
    if placement.multi_node:
        service["spec"]["selector"][ROLE_LABEL] = LEADER  # the workers serve no API
    manifests = [*workloads.values(), service]
    pod_selector = service["spec"]["selector"]
    if spec.get("prefill"):
        pod_selector = {names.LABEL_POOL: name}  # the picker chooses among both roles' pods
    manifests.extend(
        claim_templates(spec, name=name, namespace=namespace, gpus=gpus_per_replica(spec))
    )
    if wants_download(spec):
        manifests.append(download_job(spec, cluster_facts, name=name, namespace=namespace))
    manifests.extend(scrape.manifests)
    manifests.extend(disruption_budget(spec, name=name, namespace=namespace))
    model_name = resolve_model(spec).served_name
    routing = routing_manifests(
        spec,
        cluster_facts,
        name=name,
        namespace=namespace,
        pod_selector=pod_selector,
        served_name=model_name,
        scrape_mode=scrape.mode,
    )
    scaling = autoscaler(
        spec,
        cluster_facts,
        name=name,
        namespace=namespace,
        model_name=model_name,
        demand=routing.demand,
        at_zero=routing.at_zero,
    )
    manifests.extend(scaling.manifests)
    manifests.extend(routing.manifests)
    if uid:
        for manifest in manifests:
            manifest["metadata"]["ownerReferences"] = [owner_reference(name, uid)]
    support = review_engine(spec)
    warnings.extend(support.ignored)
    port = (spec.get("service") or {}).get("port", names.SERVER_PORT)
    return Plan(
        manifests=manifests,
        service_name=service_name,
        model_name=model_name,
        url=f"http://{service_name}.{namespace}.svc:{port}/v1",
        gpus_per_replica=gpus_per_replica(spec),
        selector=_label_selector(name),
        warnings=warnings,
        ignored=support.ignored,
        refused=support.refused,
        autoscaling=scaling.verdict,
        traffic_split=routing.split,
        nodes_per_replica=placement.nodes,
        gpus_per_pod=placement.gpus_per_pod,
        blocked=blocked,
        conditions={"Routing": routing.verdict} if routing.verdict else {},
        roles={role: child_id(workload) for role, workload in workloads.items()},
    )


def _workloads(
    spec: Mapping[str, Any],
    cluster_facts: ClusterFacts,
    placement: Layout,
    *,
    name: str,
    namespace: str,
    pod_annotations: Mapping[str, str],
) -> tuple[dict[str, dict[str, Any]], tuple[str, str] | None]:
    """The workloads by role and, when this cluster cannot run them, why: a replica on one node
    is a Deployment, one across nodes a LeaderWorkerSet (when the cluster serves its API)."""
    if uses_dra(spec) and not cluster_facts.serves(DRA_GV, CLAIM_TEMPLATE_KIND):
        return {}, dra_missing_api()
    if spec.get("prefill"):
        # Both roles are CPU engines (admission), so each replica is one pod.
        specs = role_specs(spec)
        return {
            role_key: deployment_manifest(
                specs[role],
                cluster_facts,
                name=name,
                namespace=namespace,
                pod_annotations=pod_annotations,
                role=role,
            )
            for role_key, role in ((SERVER, DECODE), (PREFILL, PREFILL))
        }, None
    spec = role_specs(spec)[DECODE]
    if not placement.multi_node:
        deployment = deployment_manifest(
            spec, cluster_facts, name=name, namespace=namespace, pod_annotations=pod_annotations
        )
        return {SERVER: deployment}, None
    if cluster_facts.serves(LWS_GV, LWS_KIND):
        group = leaderworkerset_manifest(
            spec,
            cluster_facts,
            placement,
            name=name,
            namespace=namespace,
            pod_annotations=pod_annotations,
        )
        return {SERVER: group}, None
    return {}, missing_api(placement.nodes)


def _label_selector(name: str) -> str:
    """The selector of the scale subresource (status.selector), as a string."""
    return ",".join(f"{key}={value}" for key, value in sorted(names.selector_labels(name).items()))


def render(
    spec: Mapping[str, Any],
    cluster_facts: ClusterFacts,
    *,
    name: str,
    namespace: str,
    uid: str | None = None,
) -> list[dict[str, Any]]:
    """The manifests for one InferenceService (owner references when its uid is known)."""
    return plan(spec, cluster_facts, name=name, namespace=namespace, uid=uid).manifests
