"""The Service, and the rule that keeps its service-link variables out of vLLM's namespace.

Kubernetes injects `<NAME>_PORT`, `<NAME>_SERVICE_HOST`, ... for every Service into pods that do
not opt out. A Service named `vllm` would set `VLLM_PORT=tcp://10.0.0.1:8000` in the namespace's
pods, which vLLM-style servers read as their own setting; so such a name gets a prefix.
"""

from collections.abc import Mapping
from typing import Any

from infernetes.operator import names

from infernetes.schema.env import ENV_VARS

RENAME_PREFIX = "infsvc-"


def service_link_variables(service_name: str, port: int) -> list[str]:
    """The variables Kubernetes injects for a Service with one TCP port (named names.PORT_NAME)."""
    prefix = service_name.upper().replace("-", "_")
    port_prefix = f"{prefix}_PORT_{port}_TCP"
    return [
        f"{prefix}_SERVICE_HOST",
        f"{prefix}_SERVICE_PORT",
        f"{prefix}_SERVICE_PORT_{names.PORT_NAME.upper().replace('-', '_')}",
        f"{prefix}_PORT",
        port_prefix,
        f"{port_prefix}_PROTO",
        f"{port_prefix}_PORT",
        f"{port_prefix}_ADDR",
    ]


def service_name_for(name: str) -> tuple[str, str | None]:
    """(service name, why it differs from the resource name or None)."""
    injected = service_link_variables(name, names.SERVER_PORT)
    if not any(var.startswith("VLLM_") for var in injected):
        return name, None
    renamed = RENAME_PREFIX + name
    known = {var.name for var in ENV_VARS}
    colliding = [var for var in injected if var in known] or injected[:1]
    reason = (
        f"Service is named {renamed!r}, not {name!r}: a Service named {name!r} would inject "
        f"{', '.join(colliding)} into the namespace's pods, which the server reads as its own settings"
    )
    return renamed, reason


def service_manifest(
    spec: Mapping[str, Any], *, name: str, namespace: str, service_name: str
) -> dict[str, Any]:
    service = spec.get("service") or {}
    metadata: dict[str, Any] = {
        "name": service_name,
        "namespace": namespace,
        "labels": names.common_labels(name),
    }
    if service.get("annotations"):
        metadata["annotations"] = dict(service["annotations"])
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": service.get("type", "ClusterIP"),
            "selector": names.selector_labels(name),
            "ports": [
                {
                    "name": names.PORT_NAME,
                    "port": service.get("port", names.SERVER_PORT),
                    "targetPort": names.PORT_NAME,
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }
