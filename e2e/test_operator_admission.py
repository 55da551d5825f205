"""The CRD on a real API server: it applies, and invalid resources are refused with the field path.

Every case goes through `kubectl create --dry-run=server`, so the API server runs the structural
schema, the enum/range checks and the CEL rules exactly as for a real create. Each setting the
runtime refuses (infernetes.schema.support) is refused here too, with the field and the reason.
"""

import copy
from typing import Any

import pytest
import yaml
from infernetes.operator.admission import Refusal, engine_refusals, env_refusals, key_refusals
from infernetes.operator.crd import build_crd
from infernetes.operator.testing import install_crds, refused_value

from infernetes.schema.args import ARGS
from infernetes.schema.env import ENV_VARS

VALID: dict[str, Any] = {
    "apiVersion": "infernetes.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "valid"},
    "spec": {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "engine": {
            "tensorParallelSize": 1,
            "maxModelLen": "16k",
            "gpuMemoryUtilization": 0.9,
            "enableAutoToolChoice": True,
            "toolCallParser": "hermes",
            "quantization": "fp8",
            "compilationConfig": {"level": 3},
        },
        "engineEnv": {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"},
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "gpu": {"count": 2, "product": "NVIDIA-H100-80GB-HBM3"},
        "shmSize": "8Gi",
        "monitoring": {"mode": "auto", "interval": "15s"},
        "rollout": {"strategy": "Auto"},
        "hfTokenSecretRef": {"name": "hf"},
        "service": {"port": 80},
    },
}


PRECISE_SCORER = {"type": "precise-prefix-cache-scorer", "weight": 2}
QUEUE_SCORER = {"type": "queue-scorer", "weight": 1}


def variant(
    spec_changes: dict[str, Any] | None = None,
    *,
    remove: str | None = None,
    name: str | None = None,
) -> dict:
    resource = copy.deepcopy(VALID)
    spec = resource["spec"]
    for dotted, value in (spec_changes or {}).items():
        target = spec
        *parents, leaf = dotted.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    if remove:
        del spec[remove]
    if name:
        resource["metadata"]["name"] = name
    return resource


# (case id, resource, text(s) the API server's error must contain: the field path and the reason)
INVALID = [
    ("no-model", variant(remove="model"), "spec.model: Required value"),
    ("tp-zero", variant({"engine.tensorParallelSize": 0}), "spec.engine.tensorParallelSize"),
    (
        "gpu-util-above-1",
        variant({"engine.gpuMemoryUtilization": 1.5}),
        "spec.engine.gpuMemoryUtilization",
    ),
    (
        "gpu-util-zero",
        variant({"engine.gpuMemoryUtilization": 0}),
        "spec.engine.gpuMemoryUtilization",
    ),
    ("dtype-enum", variant({"engine.dtype": "float128"}), "spec.engine.dtype: Unsupported value"),
    (
        "tool-parser-enum",
        variant({"engine.toolCallParser": "nope"}),
        "spec.engine.toolCallParser: Unsupported value",
    ),
    (
        "auto-tool-choice-needs-parser",
        variant({"engine.toolCallParser": None}),
        "spec.engine.toolCallParser: Invalid value",
    ),
    (
        "async-scheduling-with-pipeline-stages",
        variant({"engine.asyncScheduling": True, "engine.pipelineParallelSize": 2}),
        "spec.engine.asyncScheduling",
    ),
    (
        "cpu-loras-below-loras",
        variant({"engine.maxLoras": 4, "engine.maxCpuLoras": 2}),
        "spec.engine.maxCpuLoras",
    ),
    (
        "batched-below-model-len",
        variant(
            {
                "engine.enableChunkedPrefill": False,
                "engine.maxModelLen": 4096,
                "engine.maxNumBatchedTokens": 512,
            }
        ),
        "spec.engine.maxNumBatchedTokens",
    ),
    ("model-len-pattern", variant({"engine.maxModelLen": "lots"}), "spec.engine.maxModelLen"),
    ("bool-type", variant({"engine.enforceEager": "yes"}), "spec.engine.enforceEager"),
    (
        "lora-needs-path",
        variant({"engine.loraModules": [{"name": "a"}]}),
        "spec.engine.loraModules[0].path",
    ),
    (
        "lora-needs-enable",
        variant({"engine.enableLora": False, "engine.loraModules": [{"name": "a", "path": "/a"}]}),
        "spec.engine.loraModules",
    ),
    ("vllm-env-in-env", variant({"env": [{"name": "VLLM_PORT", "value": "1"}]}), "spec.env"),
    (
        "hf-token-in-env",
        variant({"env": [{"name": "HF_TOKEN", "value": "x"}]}),
        "spec.hfTokenSecretRef",
    ),
    (
        "vllm-prefix-envfrom",
        variant({"envFrom": [{"prefix": "VLLM_", "configMapRef": {"name": "c"}}]}),
        "spec.envFrom",
    ),
    (
        "engine-env-enum",
        variant({"engineEnv.VLLM_ATTENTION_BACKEND": "BOGUS"}),
        "spec.engineEnv.VLLM_ATTENTION_BACKEND: Unsupported value",
    ),
    (
        "engine-env-port-not-settable",
        variant({"engineEnv.VLLM_PORT": 5000}),
        "spec.engineEnv.VLLM_PORT",
    ),
    ("operator-owned-port", variant({"engine.port": 9000}), "spec.engine.port"),
    ("no-plain-api-key", variant({"engine.apiKey": "secret"}), "spec.engine.apiKey"),
    ("unknown-engine-field", variant({"engine.maxModelLength": 5}), "spec.engine.maxModelLength"),
    ("replicas-negative", variant({"replicas": -1}), "spec.replicas"),
    ("gpu-vendor-enum", variant({"gpu.vendor": "intel"}), "spec.gpu.vendor: Unsupported value"),
    (
        "gpu-count-below-parallel",
        variant({"gpu.count": 1, "engine.tensorParallelSize": 2}),
        "spec.gpu.count",
    ),
    (
        "cpu-with-gpus",
        variant({"engine.device": "cpu", "engine.tensorParallelSize": 1}),
        "spec.gpu.count",
    ),
    ("pvc-model-form", variant({"model": "pvc://Bad_Claim"}), "spec.model"),
    (
        "monitoring-mode-enum",
        variant({"monitoring.mode": "prometheus"}),
        "spec.monitoring.mode: Unsupported value",
    ),
    ("monitoring-interval", variant({"monitoring.interval": "soon"}), "spec.monitoring.interval"),
    ("service-port-range", variant({"service.port": 70000}), "spec.service.port"),
    (
        "rollout-enum",
        variant({"rollout.strategy": "BlueGreen"}),
        "spec.rollout.strategy: Unsupported value",
    ),
    ("shm-quantity", variant({"shmSize": "lots"}), "spec.shmSize"),
    (
        "startup-budget-minimum",
        variant({"probes.startupTimeoutSeconds": 5}),
        "spec.probes.startupTimeoutSeconds",
    ),
    (
        "drain-outlasts-grace-period",
        variant({"terminationGracePeriodSeconds": 30, "engine.shutdownTimeout": 45}),
        "spec.engine.shutdownTimeout",
    ),
    (
        "shutdown-timeout-into-the-pre-stop-sleep",
        variant({"terminationGracePeriodSeconds": 60, "engine.shutdownTimeout": 56}),
        ("spec.engine.shutdownTimeout", "minus the preStop sleep"),
    ),
    (
        "secret-ref-needs-name",
        variant({"hfTokenSecretRef": {"key": "t"}}),
        "spec.hfTokenSecretRef.name: Required value",
    ),
    ("name-too-long-for-service", variant(name="a" * 60), "metadata.name"),
    ("name-not-a-dns-label", variant(name="a.b"), "metadata.name"),
    # Accepted silently before (issue 20): each is refused with its path and why.
    (
        "tp-above-gpu-limit",
        variant({"engine.tensorParallelSize": 4, "resources.limits": {"nvidia.com/gpu": "1"}}),
        (
            "spec.resources.limits: Invalid value",
            "resources.limits nvidia.com/gpu must cover tensorParallelSize",
        ),
    ),
    (
        "tp-with-gpu-count-zero",
        variant({"engine.tensorParallelSize": 4, "gpu.count": 0}),
        ("spec.gpu.count: Invalid value", "0 only with engine.device cpu"),
    ),
    ("tpu-device", variant({"engine.device": "tpu"}), "spec.engine.device"),
    (
        "latency-without-a-target",
        variant({"autoscaling": {"maxReplicas": 2, "latency": {"percentile": 95}}}),
        ("spec.autoscaling.latency.ttftSeconds", "needs ttftSeconds and/or interTokenSeconds"),
    ),
    (
        "latency-window-beyond-scale-down",
        variant(
            {
                "autoscaling": {
                    "maxReplicas": 2,
                    "scaleDownStabilizationSeconds": 60,
                    "latency": {"ttftSeconds": 0.5, "windowSeconds": 120},
                }
            }
        ),
        ("spec.autoscaling.scaleDownStabilizationSeconds", "at least latency.windowSeconds"),
    ),
    (
        "dra-class-and-template",
        variant({"gpu.deviceClassName": "gpu.nvidia.com", "gpu.resourceClaimTemplateName": "t"}),
        ("spec.gpu.resourceClaimTemplateName: Invalid value", "not both"),
    ),
    (
        "dra-and-device-plugin-count",
        variant(
            {"gpu.deviceClassName": "gpu.nvidia.com", "resources.limits": {"nvidia.com/gpu": 2}}
        ),
        ("spec.resources: Invalid value", "Dynamic Resource Allocation"),
    ),
    (
        "dra-on-cpu",
        variant({"engine.device": "cpu", "gpu": {"resourceClaimTemplateName": "t"}}),
        ("spec.gpu: Invalid value", "engine.device cpu runs without GPUs"),
    ),
    (
        "dra-across-nodes",
        variant({"gpu.deviceClassName": "gpu.nvidia.com", "gpu.perNode": 2}),
        ("spec.gpu.perNode: Invalid value", "Dynamic Resource Allocation"),
    ),
    (
        "cpu-holding-gpus-through-limits",
        variant({"engine.device": "cpu", "gpu": None, "resources.limits": {"nvidia.com/gpu": 2}}),
        ("spec.resources: Invalid value", "runs without GPUs"),
    ),
    (
        "size-strings-compared-by-value",
        variant(
            {
                "engine.enableChunkedPrefill": False,
                "engine.maxModelLen": "8k",
                "engine.maxNumBatchedTokens": "1k",
            }
        ),
        "spec.engine.maxNumBatchedTokens: Invalid value",
    ),
    (
        "model-len-zero-as-string",
        variant({"engine.maxModelLen": "0"}),
        ("spec.engine.maxModelLen: Invalid value", "must be at least 1"),
    ),
    (
        "plaintext-secret-in-env",
        variant({"env": [{"name": "OPENAI_API_KEY", "value": "sk-live"}]}),
        ("spec.env[0]: Invalid value", "OPENAI_API_KEY looks like a secret", "secretKeyRef"),
    ),
    (
        "shm-too-small-for-gpus",
        variant({"gpu.count": 8, "shmSize": "1Mi"}),
        ("spec.shmSize: Invalid value", "at least 1Gi"),
    ),
    (
        "external-launcher",  # ray is admitted now (the image has it); torchrun never starts ranks
        variant({"engine.distributedExecutorBackend": "external_launcher"}),
        "spec.engine.distributedExecutorBackend",
    ),
    (
        "request-above-limit",
        variant({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}),
        ("spec.resources.requests: Invalid value", "must not exceed its limit"),
    ),
    # routing.scorers: the picker's profile; precise prefix-cache routing keeps the pods' KV
    # events, hash, seed and ranks the operator's.
    (
        "scorer-twice",
        variant({"routing.scorers": [QUEUE_SCORER, QUEUE_SCORER]}),
        ("spec.routing.scorers", "each scorer type may be listed once"),
    ),
    (
        "both-prefix-scorers",
        variant(
            {"routing.scorers": [PRECISE_SCORER, {"type": "prefix-cache-scorer", "weight": 1}]}
        ),
        ("spec.routing.scorers", "choose one prefix scorer"),
    ),
    (
        "scorer-weight-zero",
        variant({"routing.scorers": [{"type": "queue-scorer", "weight": 0}]}),
        "spec.routing.scorers[0].weight",
    ),
    (
        "hash-seed-on-queue",
        variant({"routing.scorers": [{**QUEUE_SCORER, "hashSeed": "1"}]}),
        ("spec.routing.scorers[0].hashSeed", "applies to the precise-prefix-cache-scorer only"),
    ),
    (
        "hash-seed-too-large",
        variant({"routing.scorers": [{**PRECISE_SCORER, "hashSeed": "4294967296"}]}),
        ("spec.routing.scorers[0].hashSeed", "at most 4294967295"),
    ),
    (
        "precise-without-prefix-caching",
        variant({"routing.scorers": [PRECISE_SCORER], "engine.enablePrefixCaching": False}),
        ("spec.engine.enablePrefixCaching", "must not be false"),
    ),
    (
        "precise-with-own-kv-events",
        variant(
            {
                "routing.scorers": [PRECISE_SCORER],
                "engine.kvEventsConfig": {"enable_kv_cache_events": True},
            }
        ),
        ("spec.engine.kvEventsConfig", "leave it unset"),
    ),
    (
        "precise-with-sha256",
        variant({"routing.scorers": [PRECISE_SCORER], "engine.prefixCachingHashAlgo": "sha256"}),
        ("spec.engine.prefixCachingHashAlgo", "sha256_cbor"),
    ),
    (
        "precise-with-data-parallel",
        variant({"routing.scorers": [PRECISE_SCORER], "engine.dataParallelSize": 2}),
        ("spec.engine.dataParallelSize", "must be 1"),
    ),
    (
        "precise-with-own-seed",
        variant(
            {
                "routing.scorers": [PRECISE_SCORER],
                "env": [{"name": "PYTHONHASHSEED", "value": "1"}],
            }
        ),
        ("spec.env", "set it there"),
    ),
    (
        "precise-with-flow-control",
        variant({"routing.scorers": [PRECISE_SCORER], "routing.flowControl": {}}),
        ("spec.routing.flowControl", "refuses a request when no pod is ready"),
    ),
    (
        "split-to-a-name-it-does-not-serve",
        variant(
            {"routing.splits": [{"target": "valid", "weight": 9}, {"target": "b", "weight": 1}]}
        ),
        ("spec.routing.splits", "spec.lora.adapters"),
    ),
    (
        "split-of-zero-weights",
        variant({"routing.splits": [{"target": "valid", "weight": 0}]}),
        ("spec.routing.splits", "sum to more than 0"),
    ),
    (
        "split-negative-weight",
        variant({"routing.splits": [{"target": "valid", "weight": -1}]}),
        "spec.routing.splits[0].weight",
    ),
    (
        "split-target-twice",
        variant({"routing.splits": [{"target": "valid", "weight": 1}] * 2}),
        "spec.routing.splits[1]: Duplicate value",
    ),
]


@pytest.fixture(scope="module")
def crds(cluster: Any) -> None:
    install_crds(cluster.kubectl)


def dry_run(cluster: Any, namespace: str, resource: dict) -> Any:
    body = copy.deepcopy(resource)
    _drop_nones(body)
    return cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(body),
        check=False,
    )


def _drop_nones(value: Any) -> None:
    if isinstance(value, dict):
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
        for item in value.values():
            _drop_nones(item)


def test_crd_is_established_with_short_name(cluster: Any, crds: None) -> None:
    resources = cluster.kubectl("api-resources", "--api-group=infernetes.io", "-o", "wide").stdout
    assert "infsvc" in resources and "InferenceService" in resources


def test_valid_resource_is_accepted(cluster: Any, crds: None, namespace: str) -> None:
    result = dry_run(cluster, namespace, VALID)
    assert result.returncode == 0, result.stderr


def test_precise_routing_is_accepted(cluster: Any, crds: None, namespace: str) -> None:
    resource = variant(
        {
            "routing.scorers": [
                {**PRECISE_SCORER, "hashSeed": "4294967295"},
                QUEUE_SCORER,
                {"type": "kv-cache-utilization-scorer", "weight": 1},
            ],
            "engine.prefixCachingHashAlgo": "sha256_cbor",
        }
    )
    result = dry_run(cluster, namespace, resource)
    assert result.returncode == 0, result.stderr


def test_there_are_enough_invalid_cases() -> None:
    assert len(INVALID) >= 45


@pytest.mark.parametrize(
    ("resource", "expected"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_resource_is_rejected_with_field_path(
    cluster: Any, crds: None, namespace: str, resource: dict, expected: str | tuple[str, ...]
) -> None:
    result = dry_run(cluster, namespace, resource)
    assert result.returncode != 0, f"accepted: {yaml.safe_dump(resource['spec'])}"
    for text in (expected,) if isinstance(expected, str) else expected:
        assert text in result.stderr, result.stderr
    # Every message names its field (the API server's own note that it skipped the CEL rules of
    # an object already invalid has no field).
    unnamed = [
        line
        for line in result.stderr.splitlines()
        if "<nil>" in line and "some validation rules were not checked" not in line
    ]
    assert not unnamed, result.stderr


REFUSALS = (
    [("engine", item) for item in engine_refusals(ARGS)]
    + [("engineEnv", item) for item in env_refusals(ENV_VARS)]
    + [  # keys of JSON-valued fields: spec.engine.structuredOutputsConfig.backend, ...
        (f"engine.{field}", item) for field, items in key_refusals().items() for item in items
    ]
)


@pytest.mark.parametrize(
    ("section", "refusal"), REFUSALS, ids=[f"{section}.{item.field}" for section, item in REFUSALS]
)
def test_setting_the_runtime_refuses_is_rejected_with_field_and_reason(
    cluster: Any, crds: None, namespace: str, section: str, refusal: Refusal
) -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in section.split("."):
        schema = schema["properties"][part]
    value = refused_value(schema["properties"][refusal.field], refusal)
    result = dry_run(cluster, namespace, variant({f"{section}.{refusal.field}": value}))
    assert result.returncode != 0, f"accepted {section}.{refusal.field}: {value!r}"
    assert (
        f"spec.{section}.{refusal.field}" in result.stderr and refusal.message in result.stderr
    ), result.stderr


def test_kubectl_apply_of_a_refused_value_names_the_field_and_why(
    cluster: Any, crds: None, namespace: str
) -> None:
    resource = variant(
        {"engine.ptLoadMapLocation": "cuda", "engine.fullyShardedLoras": True}, name="refused"
    )
    result = cluster.apply(resource, namespace=namespace, check=False)
    assert result.returncode != 0
    assert (
        "spec.engine.ptLoadMapLocation" in result.stderr
        and "weights load to the CPU, then move to the device" in result.stderr
    )
    assert (
        "spec.engine.fullyShardedLoras" in result.stderr
        and "the fully sharded LoRA path is not built" in result.stderr
    )
    assert cluster.kubectl("get", "infsvc", "refused", "-n", namespace, check=False).returncode != 0
