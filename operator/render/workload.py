"""The Deployment: the pod that runs `infernetes serve` with the argv rendered from spec.engine."""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infernetes.operator import names
from infernetes.operator.argv import engine_argv, engine_env
from infernetes.operator.disaggregation import (
    DECODE,
    DEFAULT_SIDE_CHANNEL_PORT,
    PREFILL,
    ROLE_LABEL,
    SIDE_CHANNEL_PORT,
    SIDE_CHANNEL_PORT_NAME,
)
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render.disaggregation import ENGINE_PORT, ENGINE_PORT_NAME, routing_sidecar
from infernetes.operator.render.dra import CLAIM, pod_claims, uses_dra
from infernetes.operator.render.lora import lora_args
from infernetes.operator.spec_schema import (
    CPU_PER_GPU,
    GPU_VENDORS,
    MEMORY_PER_GPU_GIB,
    SHUTDOWN_MARGIN_SECONDS,
    STARTUP_PROBE_PERIOD_SECONDS,
    TERMINATION_GRACE_SECONDS,
    pre_stop_seconds,
)

MODEL_MOUNT = "/mnt/models"
CACHE_MOUNT = "/var/cache/huggingface"
# The root filesystem is read-only; what the runtime writes goes to emptyDirs: /tmp (tempfile,
# torch inductor's /tmp/torchinductor_<user>, the CPU kernels' build folder) and the home
# (the runtime image's, Containerfile --home-dir): ~/.cache/infernetes/kernels (compiled CPU
# kernels while VLLM_CACHE_ROOT is unset), ~/.triton/cache (Triton's compiled kernels), ~/.cache.
TMP_MOUNT = "/tmp"
HOME_MOUNT = "/home/infernetes"
TRITON_CACHE = f"{CACHE_MOUNT}/infernetes/triton"
HEALTH_PATH = "/health"
# Extra time a rollout may take beyond the startup budget before the Deployment reports it stuck.
PROGRESS_MARGIN_SECONDS = 300
GPU_PRODUCT_LABELS = {"nvidia": "nvidia.com/gpu.product", "amd": "amd.com/gpu.product-name"}
SHM_PER_GPU_GIB = 2


@dataclass(frozen=True)
class ModelSource:
    """What --model is inside the pod, the name clients use, and the volume it needs (if any)."""

    arg: str
    served_name: str
    pass_served_name: bool
    claim: str | None = None


def model_source(spec: Mapping[str, Any]) -> ModelSource:
    model = spec["model"]
    explicit = spec.get("servedModelName")
    if model.startswith("pvc://"):
        claim, _, path = model[len("pvc://") :].partition("/")
        return ModelSource(f"{MODEL_MOUNT}/{path}", explicit or path, True, claim)
    return ModelSource(model, explicit or model, bool(explicit))


def gpu_resource(spec: Mapping[str, Any]) -> str:
    return GPU_VENDORS[(spec.get("gpu") or {}).get("vendor", "nvidia")]


def parallel_size(engine: Mapping[str, Any]) -> int:
    return math.prod(
        int(engine.get(field) or 1)
        for field in ("tensorParallelSize", "pipelineParallelSize", "dataParallelSize")
    )


def gpus_per_replica(spec: Mapping[str, Any]) -> int:
    """tensor x pipeline x data parallel size unless overridden; none for device cpu."""
    engine = spec.get("engine") or {}
    limits = (spec.get("resources") or {}).get("limits") or {}
    if gpu_resource(spec) in limits:
        return int(limits[gpu_resource(spec)])
    if engine.get("device") == "cpu":
        return 0
    count = (spec.get("gpu") or {}).get("count")
    return int(count) if count is not None else parallel_size(engine)


def host_requests(gpus: int) -> dict[str, str]:
    """CPU and memory a GPU pod requests unless spec.resources.requests says otherwise.

    Per GPU: CPU_PER_GPU cores (the HTTP side, tokenization, the scheduler loop and, with
    tensor parallelism, one worker process per GPU) and MEMORY_PER_GPU of host memory (weights
    pass through it while loading). Requests only: a CPU limit would throttle the loop that
    feeds the GPU, and host memory peaks while loading. A CPU-only pod requests nothing by
    default (its needs follow the model; set spec.resources).
    """
    if not gpus:
        return {}
    return {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_PER_GPU_GIB * gpus}Gi"}


def _resources(spec: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    override = spec.get("resources") or {}
    resources: dict[str, Any] = {}
    by_device_plugin = gpus and not uses_dra(spec)
    for section in ("requests", "limits"):
        values: dict[str, Any] = {gpu_resource(spec): gpus} if by_device_plugin else {}
        if section == "requests":
            values.update(host_requests(gpus))
        values.update(override.get(section) or {})
        if values:
            resources[section] = values
    if gpus and uses_dra(spec):
        resources["claims"] = [{"name": CLAIM}]
    return resources


def _secret_env(name: str, ref: Mapping[str, Any], default_key: str) -> dict[str, Any]:
    return {
        "name": name,
        "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": ref.get("key", default_key)}},
    }


def _env(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = list(engine_env(spec.get("engineEnv") or {}))
    if spec.get("apiKeySecretRef"):
        env.append(_secret_env("VLLM_API_KEY", spec["apiKeySecretRef"], "api-key"))
    if spec.get("hfTokenSecretRef"):
        env.append(_secret_env("HF_TOKEN", spec["hfTokenSecretRef"], "token"))
    # Both are writable volumes whatever the image's defaults (another image's home, HF cache).
    env.append({"name": "HF_HOME", "value": CACHE_MOUNT})
    env.append({"name": "HOME", "value": HOME_MOUNT})
    cache = spec.get("modelCache") or {}
    if cache and not cache.get("readOnly"):
        # Triton's compiled kernels on the claim, beside the weights: a new pod (another node, a
        # rollout) starts with them compiled instead of compiling them again.
        env.append({"name": "TRITON_CACHE_DIR", "value": TRITON_CACHE})
    # The user's variables win over ours (one entry per name: server-side apply keys env by name).
    user = [dict(item) for item in spec.get("env") or []]
    user_names = {item["name"] for item in user}
    return [item for item in env if item["name"] not in user_names] + user


def _probes(spec: Mapping[str, Any], port_name: str) -> dict[str, Any]:
    probes = spec.get("probes") or {}
    period = probes.get("periodSeconds", 10)
    timeout = probes.get("timeoutSeconds", 5)
    failures = probes.get("failureThreshold", 3)
    startup_budget = probes.get("startupTimeoutSeconds", 1800)

    def probe(**extra: Any) -> dict[str, Any]:
        return {
            "httpGet": {"path": HEALTH_PATH, "port": port_name},
            "periodSeconds": period,
            "timeoutSeconds": timeout,
            **extra,
        }

    startup_period = min(period, STARTUP_PROBE_PERIOD_SECONDS)
    return {
        # Loading weights can take many minutes; the startup probe holds the others off until then.
        "startupProbe": probe(
            periodSeconds=startup_period,
            failureThreshold=max(1, math.ceil(startup_budget / startup_period)),
        ),
        "readinessProbe": probe(failureThreshold=failures),
        "livenessProbe": probe(failureThreshold=failures),
    }


def _lifecycle(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A preStop sleep (Kubernetes' own action, no binary in the image): a terminating pod keeps
    serving while the endpoints, proxies and endpoint picker drop it, and only then gets SIGTERM
    and drains; without it, requests routed in that moment would get the drain's 503."""
    seconds = pre_stop_seconds(grace_period(spec))
    return {"lifecycle": {"preStop": {"sleep": {"seconds": seconds}}}} if seconds else {}


def _volumes(
    spec: Mapping[str, Any], source: ModelSource, gpus: int
) -> tuple[list[dict], list[dict]]:
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    shm_size = spec.get("shmSize")
    if gpus > 1 or shm_size is not None:
        # NCCL moves data between the GPUs' processes through /dev/shm; the default 64Mi is too small.
        size = shm_size if shm_size is not None else f"{SHM_PER_GPU_GIB * gpus}Gi"
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if source.claim:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True},
            }
        )
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    volumes += [{"name": "tmp", "emptyDir": {}}, {"name": "home", "emptyDir": {}}]
    mounts += [{"name": "tmp", "mountPath": TMP_MOUNT}, {"name": "home", "mountPath": HOME_MOUNT}]
    cache = spec.get("modelCache")
    if not cache:
        # Downloads land here for the pod's life; spec.modelCache keeps them across pods.
        volumes.append({"name": "hf-cache", "emptyDir": {}})
        mounts.append({"name": "hf-cache", "mountPath": CACHE_MOUNT})
    else:
        read_only = bool(cache.get("readOnly", False))
        volumes.append(
            {
                "name": "hf-cache",
                "persistentVolumeClaim": {"claimName": cache["claimName"], "readOnly": read_only},
            }
        )
        mount: dict[str, Any] = {
            "name": "hf-cache",
            "mountPath": CACHE_MOUNT,
            "readOnly": read_only,
        }
        if cache.get("subPath"):
            mount["subPath"] = cache["subPath"]
        mounts.append(mount)
    return volumes, mounts


def merged(defaults: Mapping[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """`override` over `defaults` field by field, one level into objects (capabilities.add keeps
    the default capabilities.drop)."""
    result = dict(defaults)
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = {**result[key], **value}
        else:
            result[key] = value
    return result


def pod_security_context(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The restricted Pod Security Standard as the runtime image's user, then spec's overrides."""
    defaults = {
        "runAsNonRoot": True,
        "runAsUser": names.RUNTIME_UID,
        "runAsGroup": names.RUNTIME_UID,
        "fsGroup": names.RUNTIME_UID,
        # A model cache claim holds many files: chown them only when its root is not ours yet.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return merged(defaults, spec.get("podSecurityContext"))


def container_security_context(spec: Mapping[str, Any]) -> dict[str, Any]:
    defaults = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    return merged(defaults, spec.get("securityContext"))


def grace_period(spec: Mapping[str, Any]) -> int:
    return spec.get("terminationGracePeriodSeconds", TERMINATION_GRACE_SECONDS)


def container_args(
    spec: Mapping[str, Any], facts: ClusterFacts, port: int = names.SERVER_PORT
) -> list[str]:
    """The argv after `infernetes serve`: operator-owned flags, then spec.engine's."""
    source = model_source(spec)
    args = [f"--model={source.arg}", "--host=0.0.0.0", f"--port={port}"]
    if source.pass_served_name:
        args += ["--served-model-name", source.served_name]
    engine = spec.get("engine") or {}
    if engine.get("otlpTracesEndpoint") is None and facts.otlp_traces_endpoint:
        # The operator's default collector; a spec that names its own keeps it.
        engine = {**engine, "otlpTracesEndpoint": facts.otlp_traces_endpoint}
    if engine.get("shutdownTimeout") is None:
        # The drain must end before the kubelet's SIGKILL at the end of the grace period (a
        # shutdownTimeout the user sets is checked against it at admission).
        grace = grace_period(spec)
        drain = grace - pre_stop_seconds(grace) - SHUTDOWN_MARGIN_SECONDS
        args.append(f"--shutdown-timeout={max(0, drain)}")
    return args + lora_args(spec, CACHE_MOUNT) + engine_argv(engine)


def _engine_ports(spec: Mapping[str, Any], role: str | None) -> list[dict[str, Any]]:
    """The engine's ports: its API (behind the routing sidecar on a decode pod) and, in a
    prefill/decode role, the NixlConnector's side channel."""
    api_port = (
        (ENGINE_PORT_NAME, ENGINE_PORT) if role == DECODE else (names.PORT_NAME, names.SERVER_PORT)
    )
    ports = [{"name": api_port[0], "containerPort": api_port[1], "protocol": "TCP"}]
    if role is not None:
        side_channel = (spec.get("engineEnv") or {}).get(
            SIDE_CHANNEL_PORT, DEFAULT_SIDE_CHANNEL_PORT
        )
        ports.append(
            {"name": SIDE_CHANNEL_PORT_NAME, "containerPort": side_channel, "protocol": "TCP"}
        )
    return ports


def container(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    mounts: list[dict[str, Any]],
    gpus: int,
    role: str | None = None,
) -> dict:
    """The engine's container; `role` DECODE or PREFILL in a prefill/decode pair."""
    ports = _engine_ports(spec, role)
    result: dict[str, Any] = {
        "name": names.CONTAINER_NAME,
        "image": spec.get("image") or facts.default_image,
        "command": ["infernetes", "serve"],
        "args": container_args(spec, facts, ports[0]["containerPort"]),
        "ports": ports,
        **_probes(spec, ports[0]["name"]),
        **_lifecycle(spec),
        # The last lines of a crash end up in the pod's status, which the operator reports as Degraded.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(spec),
    }
    env = _env(spec)
    if env:
        result["env"] = env
    if spec.get("imagePullPolicy"):
        result["imagePullPolicy"] = spec["imagePullPolicy"]
    if spec.get("envFrom"):
        result["envFrom"] = [dict(item) for item in spec["envFrom"]]
    resources = _resources(spec, gpus)
    if resources:
        result["resources"] = resources
    if mounts:
        result["volumeMounts"] = mounts
    return result


def topology_spread(spec: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """spec.topologySpreadConstraints; one without a labelSelector spreads this resource's pods."""
    constraints = []
    for item in spec["topologySpreadConstraints"]:
        constraint = dict(item)
        constraint.setdefault("labelSelector", {"matchLabels": names.selector_labels(name)})
        constraints.append(constraint)
    return constraints


def pod_spec(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    name: str,
    gpus: int | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """The pod of a replica, or with `gpus`, one of its pods (a replica across nodes); a
    decode pod (`role` DECODE) has the routing sidecar in front of its engine."""
    source = model_source(spec)
    gpus = gpus_per_replica(spec) if gpus is None else gpus
    volumes, mounts = _volumes(spec, source, gpus)
    containers = [container(spec, facts, mounts, gpus, role)]
    if role == DECODE:
        containers.append(routing_sidecar(container_security_context(spec), _lifecycle(spec)))
    pod: dict[str, Any] = {
        # Service links would put <SERVICE>_PORT variables (VLLM_PORT for a Service named vllm) in the env.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_period(spec),
        "securityContext": pod_security_context(spec),
        "containers": containers,
    }
    if spec.get("imagePullSecrets"):
        pod["imagePullSecrets"] = [{"name": item["name"]} for item in spec["imagePullSecrets"]]
    node_selector = dict(spec.get("nodeSelector") or {})
    gpu = spec.get("gpu") or {}
    if gpus and gpu.get("product"):
        node_selector[GPU_PRODUCT_LABELS[gpu.get("vendor", "nvidia")]] = gpu["product"]
    if node_selector:
        pod["nodeSelector"] = node_selector
    tolerations = [dict(item) for item in spec.get("tolerations") or []]
    if gpus:
        tolerations.append(
            {"key": gpu_resource(spec), "operator": "Exists", "effect": "NoSchedule"}
        )
    if tolerations:
        pod["tolerations"] = tolerations
    for field in ("affinity", "priorityClassName", "runtimeClassName", "serviceAccountName"):
        if spec.get(field):
            pod[field] = spec[field]
    if spec.get("topologySpreadConstraints"):
        pod["topologySpreadConstraints"] = topology_spread(spec, name)
    if volumes:
        pod["volumes"] = volumes
    if gpus and uses_dra(spec):
        pod["resourceClaims"] = pod_claims(spec, name, gpus)
    return pod


def rollout_strategy(spec: Mapping[str, Any], facts: ClusterFacts) -> dict[str, Any]:
    """RollingUpdate or Recreate; Auto avoids a surge pod that could never get its GPUs."""
    strategy = (spec.get("rollout") or {}).get("strategy", "Auto")
    gpus = gpus_per_replica(spec)
    if strategy == "Auto":
        spare = None if facts.spare_gpus is None else facts.spare_gpus.get(gpu_resource(spec), 0)
        if gpus == 0 or (spare is not None and spare >= gpus):
            strategy = "RollingUpdate"
        elif spec.get("replicas", 1) > 1:
            # No room for an extra pod: replace one at a time and keep the others serving.
            return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        else:
            strategy = "Recreate"
    if strategy == "Recreate":
        return {"type": "Recreate"}
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1 if gpus else "25%", "maxUnavailable": 0},
    }


def workload_name(name: str, role: str | None) -> str:
    """The prefill role's workload is <name>-prefill; the decode (or only) one is <name>."""
    return f"{name}-{PREFILL}" if role == PREFILL else name


def deployment_manifest(
    spec: Mapping[str, Any],
    facts: ClusterFacts,
    *,
    name: str,
    namespace: str,
    pod_annotations: Mapping[str, str],
    role: str | None = None,
) -> dict[str, Any]:
    """The Deployment of the one server role, or with `role`, of the prefill or decode role."""
    labels = names.common_labels(name)
    pod_labels = {**(spec.get("podLabels") or {}), **labels}
    if role is not None:
        labels = {**labels, ROLE_LABEL: role}
        # Both roles' pods are the pool's; the selectors keep each Deployment to its own.
        pod_labels = {
            **pod_labels,
            **names.role_selector_labels(name, prefill=role == PREFILL),
            ROLE_LABEL: role,
        }
        pod_labels[names.LABEL_POOL] = name
    template_metadata: dict[str, Any] = {"labels": pod_labels}
    annotations = {**(spec.get("podAnnotations") or {}), **pod_annotations}
    if annotations:
        template_metadata["annotations"] = annotations
    startup_budget = (spec.get("probes") or {}).get("startupTimeoutSeconds", 1800)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": workload_name(name, role), "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": spec.get("replicas", 1),
            "selector": {"matchLabels": names.role_selector_labels(name, prefill=role == PREFILL)},
            "strategy": rollout_strategy(spec, facts),
            "progressDeadlineSeconds": startup_budget + PROGRESS_MARGIN_SECONDS,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": template_metadata,
                "spec": pod_spec(spec, facts, name, role=role),
            },
        },
    }
