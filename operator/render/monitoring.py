"""Scrape configuration: ServiceMonitor, else PodMonitor, else prometheus.io annotations.

The pods carry the prometheus.io annotations whatever the mode (but `none`): the choice between a
ServiceMonitor, a PodMonitor and annotations follows the APIs the cluster serves, and those may
appear or go while pods run; with the annotations always there, that choice never changes the pod
template, so it never restarts a GPU pod. A Prometheus that scrapes by annotation and by
ServiceMonitor alike should drop one of the two (its relabelling decides).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import MONITORING_GV, ClusterFacts

METRICS_PATH = "/metrics"


@dataclass
class ScrapeConfig:
    manifests: list[dict[str, Any]] = field(default_factory=list)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    mode: str = "none"  # serviceMonitor, podMonitor, annotations or none: as chosen for the cluster


def _choose(mode: str, facts: ClusterFacts) -> tuple[str, str | None]:
    has_sm = facts.serves(MONITORING_GV, "ServiceMonitor")
    has_pm = facts.serves(MONITORING_GV, "PodMonitor")
    if mode == "auto":
        return ("serviceMonitor" if has_sm else "podMonitor" if has_pm else "annotations"), None
    if (mode == "serviceMonitor" and not has_sm) or (mode == "podMonitor" and not has_pm):
        kind = "ServiceMonitor" if mode == "serviceMonitor" else "PodMonitor"
        return "annotations", (
            f"monitoring.mode is {mode} but the cluster does not serve {MONITORING_GV} {kind}; "
            "using prometheus.io annotations instead"
        )
    return mode, None


def scrape_config(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    *,
    name: str,
    namespace: str,
) -> ScrapeConfig:
    monitoring = spec.get("monitoring") or {}
    mode, warning = _choose(monitoring.get("mode", "auto"), facts)
    result = ScrapeConfig(warnings=[warning] if warning else [], mode=mode)
    interval = monitoring.get("interval", "30s")
    labels = {**(monitoring.get("labels") or {}), **names.common_labels(name)}
    metadata = {"name": name, "namespace": namespace, "labels": labels}
    endpoint = {"port": names.PORT_NAME, "path": METRICS_PATH, "interval": interval}
    if mode == "serviceMonitor":
        result.manifests.append(
            {
                "apiVersion": MONITORING_GV,
                "kind": "ServiceMonitor",
                "metadata": metadata,
                "spec": {
                    "selector": {"matchLabels": names.common_labels(name)},
                    "endpoints": [endpoint],
                },
            }
        )
    elif mode == "podMonitor":
        result.manifests.append(
            {
                "apiVersion": MONITORING_GV,
                "kind": "PodMonitor",
                "metadata": metadata,
                "spec": {
                    "selector": {"matchLabels": names.selector_labels(name)},
                    "podMetricsEndpoints": [endpoint],
                },
            }
        )
    if mode != "none":
        result.pod_annotations = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(names.SERVER_PORT),
            "prometheus.io/path": METRICS_PATH,
        }
    return result
