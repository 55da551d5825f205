"""spec.prefill and spec.kvCache.offload rendered: two named workloads whose engines carry the
NixlConnector in their roles, llm-d's routing sidecar in the decode pods, the picker's P/D
profiles, selectors that keep each role's pods apart, the prefill role's status, and the CRD's
rules (e2e/test_disaggregated_serving.py has the API server evaluate them)."""

import json
from pathlib import Path
from typing import Any

import yaml
from infernetes.operator.crd import build_crd
from infernetes.operator.disaggregation import (
    ROLE_LABEL,
    SHARED_ENGINE_FIELDS,
    role_engine_fields,
)
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.picker_config import picker_config
from infernetes.operator.render import SERVER, plan
from infernetes.operator.render.disaggregation import SIDECAR_IMAGE, role_specs
from infernetes.operator.render.inference_pool import LLMD_SCHEDULER_IMAGE
from infernetes.operator.status import role_status

from infernetes.schema.parser import parse_serve_args

SERVED = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])
LLMD_SCHEDULER = Path.home() / "go/pkg/mod/github.com/llm-d/llm-d-inference-scheduler@v0.4.0"


def pd_spec(**prefill: Any) -> dict[str, Any]:
    return {
        "model": "org/model",
        "replicas": 2,
        "resources": {"requests": {"cpu": "2"}},
        "engine": {"device": "cpu", "maxModelLen": 512, "maxNumSeqs": 4},
        "engineEnv": {"VLLM_NIXL_SIDE_CHANNEL_PORT": 5700},
        "prefill": {"replicas": 1, **prefill},
        "routing": {},
    }


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def engine_config(container: dict[str, Any]) -> Any:
    assert container["command"] == ["infernetes", "serve"]
    return parse_serve_args(container["args"])


def test_both_roles_are_named_workloads_with_the_connector_in_their_roles() -> None:
    result = plan(
        pd_spec(engine={"maxNumBatchedTokens": 1024}, resources={"requests": {"cpu": "4"}}),
        SERVED,
        name="svc",
        namespace="ns",
    )
    decode, prefill = result.workloads[SERVER], result.workloads["prefill"]
    assert (decode["metadata"]["name"], prefill["metadata"]["name"]) == ("svc", "svc-prefill")
    assert (decode["spec"]["replicas"], prefill["spec"]["replicas"]) == (2, 1)
    decode_engine, sidecar = decode["spec"]["template"]["spec"]["containers"]
    (prefill_engine,) = prefill["spec"]["template"]["spec"]["containers"]
    decode_config, prefill_config = engine_config(decode_engine), engine_config(prefill_engine)
    assert decode_config.kv_transfer_config == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_consumer",
    }
    assert prefill_config.kv_transfer_config == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
    }
    # prefill.engine is merged over spec.engine; the resources are the role's own.
    assert prefill_config.max_num_batched_tokens == 1024
    assert decode_config.max_num_batched_tokens != 1024
    assert prefill_config.max_model_len == decode_config.max_model_len == 512
    assert prefill_engine["resources"] == {"requests": {"cpu": "4"}}
    assert decode_engine["resources"] == {"requests": {"cpu": "2"}}
    for engine in (decode_engine, prefill_engine):
        env = {item["name"]: item for item in engine["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}
        }
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5700"
        assert {"name": "nixl", "containerPort": 5700, "protocol": "TCP"} in engine["ports"]
    # The decode engine sits behind the sidecar, which holds the pod's serving port.
    assert decode_config.port == 8200
    assert decode_engine["readinessProbe"]["httpGet"]["port"] == "engine"
    assert prefill_config.port == 8000
    assert sidecar["image"] == SIDECAR_IMAGE
    assert sidecar["args"] == [
        "--port=8000",
        "--vllm-port=8200",
        "--connector=nixlv2",
        "--secure-proxy=false",
    ]
    assert sidecar["ports"][0]["name"] == "http"


def test_selectors_keep_the_roles_apart_and_the_pool_holds_both() -> None:
    result = plan(pd_spec(), SERVED, name="svc", namespace="ns")
    decode, prefill = result.workloads[SERVER], result.workloads["prefill"]
    decode_pod = decode["spec"]["template"]["metadata"]["labels"]
    prefill_pod = prefill["spec"]["template"]["metadata"]["labels"]
    assert (decode_pod[ROLE_LABEL], prefill_pod[ROLE_LABEL]) == ("decode", "prefill")
    decode_selector = decode["spec"]["selector"]["matchLabels"]
    prefill_selector = prefill["spec"]["selector"]["matchLabels"]
    assert matches(decode_selector, decode_pod) and not matches(decode_selector, prefill_pod)
    assert matches(prefill_selector, prefill_pod) and not matches(prefill_selector, decode_pod)
    # Adding a prefill role leaves the decode Deployment's (immutable) selector as it was.
    alone = plan({"model": "org/model"}, SERVED, name="svc", namespace="ns")
    assert decode_selector == alone.workloads[SERVER]["spec"]["selector"]["matchLabels"]
    kinds = {m["kind"]: m for m in result.manifests if m["metadata"]["name"] == "svc"}
    service = kinds["Service"]["spec"]["selector"]
    assert matches(service, decode_pod) and not matches(service, prefill_pod)
    pool = kinds["InferencePool"]["spec"]["selector"]["matchLabels"]
    assert matches(pool, decode_pod) and matches(pool, prefill_pod)
    # Both are children of the resource (the operator's caches key them by its instance label).
    for workload in (decode, prefill):
        assert workload["metadata"]["labels"]["app.kubernetes.io/instance"] == "svc"
        assert workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == (
            "svc"
        )


def test_the_picker_runs_llmd_scheduler_with_prefill_and_decode_profiles() -> None:
    result = plan(pd_spec(), SERVED, name="svc", namespace="ns")
    picker = next(
        m
        for m in result.manifests
        if (m["kind"], m["metadata"]["name"]) == ("Deployment", "svc-epp")
    )
    container = picker["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == LLMD_SCHEDULER_IMAGE
    (text,) = [arg for arg in container["args"] if arg.startswith("--config-text=")]
    config = yaml.safe_load(text.removeprefix("--config-text="))
    assert config == picker_config(pd_spec())
    plugin_types = {item["type"] for item in config["plugins"]}
    assert {"pd-profile-handler", "prefill-header-handler", "prefill-filter", "decode-filter"} <= (
        plugin_types
    )
    profiles = {
        item["name"]: [ref["pluginRef"] for ref in item["plugins"]]
        for item in config["schedulingProfiles"]
    }
    assert profiles["prefill"][0] == "prefill-filter"
    assert profiles["decode"][0] == "decode-filter"
    for refs in profiles.values():
        assert set(refs) <= plugin_types


def test_the_pd_plugins_are_llmd_schedulers_own() -> None:
    """The plugin types rendered are those llm-d's inference scheduler v0.4.0 registers."""
    register = LLMD_SCHEDULER / "pkg/plugins/register.go"
    if not register.exists():
        import pytest

        pytest.skip("llm-d's inference scheduler module is not in the Go module cache")
    sources = "".join(path.read_text() for path in (LLMD_SCHEDULER / "pkg/plugins").rglob("*.go"))
    for plugin in (
        "pd-profile-handler",
        "prefill-header-handler",
        "prefill-filter",
        "decode-filter",
    ):
        assert f'"{plugin}"' in sources


def test_without_prefill_the_render_is_the_one_server() -> None:
    result = plan({"model": "org/model", "routing": {}}, SERVED, name="svc", namespace="ns")
    assert set(result.roles) == {SERVER}
    (container,) = result.workloads[SERVER]["spec"]["template"]["spec"]["containers"]
    assert engine_config(container).kv_transfer_config is None
    assert ROLE_LABEL not in result.workloads[SERVER]["spec"]["template"]["metadata"]["labels"]


def test_kv_cache_offload_renders_the_offloading_flags() -> None:
    spec = {
        "model": "org/model",
        "engine": {"device": "cpu"},
        "kvCache": {"offload": {"sizeGiB": 2.5}},
    }
    result = plan(spec, ClusterFacts(), name="svc", namespace="ns")
    (container,) = result.workloads[SERVER]["spec"]["template"]["spec"]["containers"]
    config = engine_config(container)
    assert config.kv_offloading_size == 2.5
    assert config.kv_offloading_backend == "native"
    assert role_specs(spec).keys() == {"decode"}


def test_prefill_status_is_read_from_its_own_deployment() -> None:
    deployment = {
        "metadata": {"generation": 2},
        "status": {
            "observedGeneration": 2,
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
            "availableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}
            ],
        },
    }
    status = role_status(
        generation=5, desired_replicas=1, deployment=deployment, pods=[], previous=None, now="t"
    )
    conditions = {item["type"]: item for item in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Available"]["status"] == "True"
    assert status["readyReplicas"] == 1
    missing = role_status(
        generation=5, desired_replicas=1, deployment=None, pods=[], previous=None, now="t"
    )
    assert {item["type"]: item["status"] for item in missing["conditions"]}["Ready"] == "False"


def crd_spec() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_crd_types_prefill_and_kv_cache() -> None:
    spec = crd_spec()
    prefill = spec["properties"]["prefill"]["properties"]
    assert set(prefill) == {"replicas", "resources", "engine"}
    # The role's own fields only: scheduling and cache sizes, never the model or the KV layout.
    role_fields = prefill["engine"]["properties"].keys()
    assert role_fields == set(role_engine_fields())
    assert {"maxNumBatchedTokens", "maxNumSeqs", "gpuMemoryUtilization"} <= role_fields
    assert not role_fields & {*SHARED_ENGINE_FIELDS, "tensorParallelSize", "kvTransferConfig"}
    assert role_fields < spec["properties"]["engine"]["properties"].keys()
    offload = spec["properties"]["kvCache"]["properties"]["offload"]
    assert offload["properties"]["tier"]["enum"] == ["cpu"]
    rules = json.dumps(spec["x-kubernetes-validations"])
    for path in (
        ".routing",
        ".engine.device",
        ".kvCache.offload",
        ".engine.kvTransferConfig",
    ):
        assert f'"fieldPath": "{path}"' in rules


def test_the_crd_stays_within_what_kubectl_apply_can_store() -> None:
    # Client-side `kubectl apply` keeps the whole object in an annotation of at most 256 KiB.
    assert len(json.dumps(build_crd(), separators=(",", ":"))) < 262144
