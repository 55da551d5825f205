"""The specs each role's workload is rendered from (spec.prefill, spec.kvCache.offload) and the
decode pods' routing sidecar: llm-d's pd-sidecar, in front of the engine on the pod's serving
port (operator/disaggregation.py says how a request goes)."""

from collections.abc import Mapping
from typing import Any

from infernetes.operator import names
from infernetes.operator.disaggregation import (
    DECODE,
    KV_ROLES,
    NIXL_CONNECTOR,
    PREFILL,
    SIDE_CHANNEL_HOST,
)

# llm-d's routing sidecar at LLMD_INFERENCE_SCHEDULER_VERSION (cluster/versions.env; built from
# that module's cmd/pd-sidecar by cluster/pd-sidecar.sh), speaking vLLM's NIXL v2 protocol.
SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0"
SIDECAR_NAME = "routing-sidecar"
# Behind the sidecar the engine listens here (llm-d's own layout: sidecar 8000, engine 8200).
ENGINE_PORT = 8200
ENGINE_PORT_NAME = "engine"


def with_offload(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """spec.kvCache.offload as the engine's --kv-offloading-size and --kv-offloading-backend."""
    offload = (spec.get("kvCache") or {}).get("offload")
    if not offload:
        return spec
    engine = {
        **(spec.get("engine") or {}),
        "kvOffloadingSize": offload["sizeGiB"],
        "kvOffloadingBackend": "native",  # tier cpu: vLLM's OffloadingConnector
    }
    return {**spec, "engine": engine}


def role_specs(spec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """{role: the spec its workload is rendered from}: only DECODE without spec.prefill (the
    one server role), else DECODE and PREFILL, each engine with the NixlConnector in its
    kv_role and its side channel on the pod's address."""
    spec = with_offload(spec)
    prefill = spec.get("prefill")
    if not prefill:
        return {DECODE: spec}
    decode_spec = _nixl_role(spec, DECODE)
    prefill_spec = {
        **spec,
        "replicas": prefill.get("replicas", 1),
        "resources": prefill.get("resources", spec.get("resources")),
        "engine": {**(spec.get("engine") or {}), **(prefill.get("engine") or {})},
    }
    return {DECODE: decode_spec, PREFILL: _nixl_role(prefill_spec, PREFILL)}


def _nixl_role(spec: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    engine = {
        **(spec.get("engine") or {}),
        "kvTransferConfig": {"kv_connector": NIXL_CONNECTOR, "kv_role": KV_ROLES[role]},
    }
    # The address a prefill engine hands out as remote_host, and where a decode engine's side
    # channel answers: the pod's own (the kubelet fills it in).
    env = [
        *(spec.get("env") or []),
        {"name": SIDE_CHANNEL_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    return {**spec, "engine": engine, "env": env}


def routing_sidecar(security_context: Mapping[str, Any], lifecycle: Mapping[str, Any]) -> dict:
    """llm-d's pd-sidecar on the pod's serving port: a request the picker gave a prefill pod
    (header x-prefiller-host-port) goes there first, then to the engine on ENGINE_PORT; any
    other request, and every other path (/metrics, /health of the engine), straight to it."""
    return {
        "name": SIDECAR_NAME,
        "image": SIDECAR_IMAGE,
        "args": [
            f"--port={names.SERVER_PORT}",
            f"--vllm-port={ENGINE_PORT}",
            "--connector=nixlv2",
            # Plain HTTP, as the Service, the pool and the prefill pods speak.
            "--secure-proxy=false",
        ],
        "ports": [{"name": names.PORT_NAME, "containerPort": names.SERVER_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": names.PORT_NAME}, "periodSeconds": 2},
        **lifecycle,
        "securityContext": dict(security_context),
    }
