"""spec.routing.scorers: the picker's EndpointPickerConfig, and with llm-d's precise prefix-cache
scorer, llm-d's inference scheduler as the picker and serving pods that publish their KV events to
its indexer as llm-d expects (the runtime parses what the operator renders)."""

import json
from typing import Any

import yaml
from infernetes.operator.crd import build_crd
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.picker_config import (
    DEFAULT_HASH_SEED,
    KV_EVENTS_PORT,
    LLMD_SCHEDULER_IMAGE,
    PRECISE,
)
from infernetes.operator.render import plan
from infernetes.operator.render.inference_pool import DEFAULT_EPP_IMAGE
from infernetes.runtime.kv_events.config import kv_events_config

from infernetes.schema.parser import parse_with_notices

SERVED = ClusterFacts.from_api_versions(["inference.networking.k8s.io/v1"])
PRECISE_SCORERS = [
    {"type": PRECISE, "weight": 3, "hashSeed": "1234"},
    {"type": "queue-scorer", "weight": 1},
    {"type": "kv-cache-utilization-scorer", "weight": 1},
]


def spec(scorers: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    routing = {} if scorers is None else {"scorers": scorers}
    return {"model": "org/model", "servedModelName": "chat", "routing": routing, **extra}


def deployments(body: dict[str, Any], facts: ClusterFacts = SERVED) -> tuple[dict, dict | None]:
    result = plan(body, facts, name="svc", namespace="ns")
    found = {m["metadata"]["name"]: m for m in result.manifests if m["kind"] == "Deployment"}
    return found["svc"], found.get("svc-epp")


def container(deployment: dict) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def picker_config(picker: dict) -> dict[str, Any]:
    (text,) = [a for a in container(picker)["args"] if a.startswith("--config-text=")]
    return yaml.safe_load(text.removeprefix("--config-text="))


def test_default_scorers_are_the_extensions_profile_on_its_picker() -> None:
    server, picker = deployments(spec())
    assert picker is not None and container(picker)["image"] == DEFAULT_EPP_IMAGE
    config = picker_config(picker)
    assert config["kind"] == "EndpointPickerConfig"
    assert [p["type"] for p in config["plugins"]] == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
    ]
    assert config["schedulingProfiles"] == [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "queue-scorer", "weight": 2},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
            ],
        }
    ]
    # Approximate routing asks nothing of the pods.
    args = " ".join(container(server)["args"])
    assert "--kv-events-config" not in args and "--prefix-caching-hash-algo" not in args


def test_chosen_scorers_and_weights_are_the_profile() -> None:
    scorers = [{"type": "queue-scorer", "weight": 5}, {"type": "prefix-cache-scorer", "weight": 1}]
    _, picker = deployments(spec(scorers))
    assert picker is not None
    config = picker_config(picker)
    assert config["plugins"] == [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer"}]
    assert config["schedulingProfiles"][0]["plugins"] == [
        {"pluginRef": "queue-scorer", "weight": 5},
        {"pluginRef": "prefix-cache-scorer", "weight": 1},
    ]


def test_precise_routing_runs_llmds_scheduler_with_its_indexer_listening() -> None:
    _, picker = deployments(spec(PRECISE_SCORERS, engine={"blockSize": 32}))
    assert picker is not None and container(picker)["image"] == LLMD_SCHEDULER_IMAGE
    (plugin,) = [p for p in picker_config(picker)["plugins"] if p["type"] == PRECISE]
    params = plugin["parameters"]
    assert params["indexerConfig"]["tokenProcessorConfig"] == {"blockSize": 32, "hashSeed": "1234"}
    assert params["indexerConfig"]["kvBlockIndexConfig"] == {"enableMetrics": True}
    assert params["kvEventsConfig"] == {
        "zmqEndpoint": f"tcp://*:{KV_EVENTS_PORT}",
        "topicFilter": "kv@",
    }
    assert {"name": "kv-events", "containerPort": KV_EVENTS_PORT} in container(picker)["ports"]
    result = plan(spec(PRECISE_SCORERS), SERVED, name="svc", namespace="ns")
    (service,) = [
        m for m in result.manifests if m["kind"] == "Service" and m["metadata"]["name"] == "svc-epp"
    ]
    assert {"name": "kv-events", "port": KV_EVENTS_PORT, "protocol": "TCP"} in service["spec"][
        "ports"
    ]
    assert "precise-prefix-cache-scorer 3" in result.conditions["Routing"][2]


def test_precise_routing_pods_publish_to_the_picker_as_llmd_expects() -> None:
    server, _ = deployments(spec(PRECISE_SCORERS))
    pod = container(server)
    env = {item["name"]: item for item in pod["env"]}
    assert env["PYTHONHASHSEED"]["value"] == "1234"
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # What the kubelet starts: $(POD_IP) substituted; the runtime parses it as given.
    argv = [arg.replace("$(POD_IP)", "10.1.2.3") for arg in pod["args"]]
    config, _ = parse_with_notices(argv)
    assert config.prefix_caching_hash_algo == "sha256_cbor"
    assert config.block_size == 16  # written out: the indexer chunks by the same size
    events = kv_events_config(config.kv_events_config)
    assert events is not None and events.enable_kv_cache_events
    assert events.publisher == "zmq"
    assert events.endpoint == f"tcp://svc-epp:{KV_EVENTS_PORT}"  # connected, not bound
    # The pod's address alone: llm-d's scorer looks the pool's pod address (no port) up.
    assert events.topic == "kv@10.1.2.3@chat"


def test_precise_seed_defaults_and_the_users_engine_fields_stay() -> None:
    scorers = [{"type": PRECISE, "weight": 1}]
    server, picker = deployments(spec(scorers, engine={"maxNumSeqs": 7}))
    assert picker is not None
    env = {item["name"]: item for item in container(server)["env"]}
    assert env["PYTHONHASHSEED"]["value"] == DEFAULT_HASH_SEED
    config, _ = parse_with_notices(container(server)["args"])
    assert config.max_num_seqs == 7
    tokens = picker_config(picker)["plugins"][0]["parameters"]["indexerConfig"]
    assert tokens["tokenProcessorConfig"]["hashSeed"] == DEFAULT_HASH_SEED


def test_without_the_pool_api_the_pods_publish_nothing() -> None:
    server, picker = deployments(spec(PRECISE_SCORERS), ClusterFacts())
    assert picker is None
    assert not any("kv-events" in arg for arg in container(server)["args"])
    assert "PYTHONHASHSEED" not in {item["name"] for item in container(server).get("env", [])}


def test_an_explicit_picker_image_wins() -> None:
    body = spec(PRECISE_SCORERS)
    body["routing"]["endpointPicker"] = {"image": "example.com/scheduler:dev"}
    _, picker = deployments(body)
    assert picker is not None and container(picker)["image"] == "example.com/scheduler:dev"


def crd_spec() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_crd_types_the_scorers_and_refuses_what_breaks_precise_routing() -> None:
    schema = crd_spec()
    scorers = schema["properties"]["routing"]["properties"]["scorers"]
    item = scorers["items"]
    assert item["properties"]["type"]["enum"] == [
        PRECISE,
        "prefix-cache-scorer",
        "queue-scorer",
        "kv-cache-utilization-scorer",
    ]
    assert item["required"] == ["type", "weight"]
    assert item["properties"]["weight"]["minimum"] == 1
    item_rules = " ".join(r["rule"] for r in item["x-kubernetes-validations"])
    assert "int(self.hashSeed) <= 4294967295" in item_rules
    messages = " ".join(r["message"] for r in scorers["x-kubernetes-validations"])
    assert "listed once" in messages and "choose one prefix scorer" in messages
    paths = {
        r.get("fieldPath"): r["message"]
        for r in schema["x-kubernetes-validations"]
        if PRECISE in r["message"]
    }
    assert set(paths) == {
        ".engine.enablePrefixCaching",
        ".engine.kvEventsConfig",
        ".engine.prefixCachingHashAlgo",
        ".engine.dataParallelSize",
        ".env",
        ".routing.flowControl",
        ".routing.splits",
    }
    # llm-d's scheduler is also the picker with spec.prefill: the same two refusals say so.
    for path in (".routing.flowControl", ".routing.splits"):
        assert "spec.prefill" in paths[path]
    # Every engine field a rule names exists (CEL refuses a rule on an undeclared field).
    engine = schema["properties"]["engine"]["properties"]
    for path in paths:
        if path.startswith(".engine."):
            assert path.removeprefix(".engine.") in engine
    assert json.dumps(schema)  # serialisable as the API server takes it
