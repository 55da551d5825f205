"""spec.routing.gateway -> the HTTPRoute that attaches the InferencePool to the user's Gateways.

The Gateway (its listeners, hostnames, TLS, its class's controller) stays the user's: the route
only names it in parentRefs and sends every path it accepts to the pool, whose endpoint picker
then chooses the pod. The request timeout is the route's own (Gateway API `timeouts.request`):
a gateway's default (Envoy's is 15 s) would cut a long generation short.
"""

from collections.abc import Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.facts import GATEWAY_GV

ROUTE_KIND = "HTTPRoute"
GATEWAY_GROUP = GATEWAY_GV.split("/")[0]
DEFAULT_REQUEST_TIMEOUT = "300s"  # the extension's own example routes use this


def parent_ref(ref: Mapping[str, Any]) -> dict[str, Any]:
    parent = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": ref["name"]}
    for key in ("namespace", "sectionName"):
        if ref.get(key):
            parent[key] = ref[key]
    return parent


def http_route(
    gateway: Mapping[str, Any], *, name: str, namespace: str, pool_group: str, pool_kind: str
) -> dict[str, Any]:
    """An HTTPRoute named like the InferenceService from `gateway.refs` to its pool."""
    return {
        "apiVersion": GATEWAY_GV,
        "kind": ROUTE_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": names.common_labels(name)},
        "spec": {
            "parentRefs": [parent_ref(ref) for ref in gateway["refs"]],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [{"group": pool_group, "kind": pool_kind, "name": name}],
                    "timeouts": {"request": gateway.get("requestTimeout", DEFAULT_REQUEST_TIMEOUT)},
                }
            ],
        },
    }


def gateways(gateway: Mapping[str, Any], namespace: str) -> str:
    """The Gateways a route attaches to, as `kubectl get gateway` names them (ns/name)."""
    return ", ".join(
        f"{ref.get('namespace', namespace)}/{ref['name']}"
        + (f" ({ref['sectionName']})" if ref.get("sectionName") else "")
        for ref in gateway["refs"]
    )
