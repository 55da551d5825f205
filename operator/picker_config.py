"""spec.routing.scorers -> the endpoint picker's EndpointPickerConfig, and what precise prefix-cache
routing asks of the serving pods.

The picker scores every pod with the scorers of its scheduling profile, each score weighted, and
takes the best. `prefix-cache-scorer` (the Inference Extension's) guesses which pod holds a
prompt's prefix from the requests it has routed; `precise-prefix-cache-scorer` (llm-d's, in
llm-d's inference scheduler only) knows it: the pods publish their KV-cache events to the
picker's indexer, which recomputes the prompt's block hashes as vLLM does (sha256_cbor, seeded by
PYTHONHASHSEED) and looks them up. So with it every pod publishes its events to the picker
(topic `kv@<pod-ip>@<model>`, the pod and model the indexer files the blocks under),
hashes with sha256_cbor and the indexer's seed, and uses the indexer's block size.
"""

from collections.abc import Mapping
from typing import Any

PRECISE = "precise-prefix-cache-scorer"
APPROXIMATE = "prefix-cache-scorer"
QUEUE = "queue-scorer"
KV_UTILISATION = "kv-cache-utilization-scorer"
SCORER_TYPES = (PRECISE, APPROXIMATE, QUEUE, KV_UTILISATION)
# The Inference Extension's default profile: least queue, least KV usage, longest cached prefix.
DEFAULT_SCORERS = (
    {"type": QUEUE, "weight": 2},
    {"type": KV_UTILISATION, "weight": 2},
    {"type": APPROXIMATE, "weight": 3},
)
MAX_WEIGHT = 100
# The Gateway API Inference Extension's picker at INFERENCE_EXTENSION_VERSION
# (cluster/versions.env): the build the tests run (cluster/epp.sh).
DEFAULT_EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
# Its flow control (feature gate `flowControl`): a request waits in the picker while no pod can
# take it (none at all, at zero replicas, or all saturated), up to a TTL and a queue bound.
FLOW_CONTROL_GATE = "flowControl"
DEFAULT_HOLD_SECONDS = 120
DEFAULT_MAX_HELD_REQUESTS = 1000
# llm-d's inference scheduler at LLMD_INFERENCE_SCHEDULER_VERSION (cluster/versions.env): the
# picker build that has the precise scorer.
LLMD_SCHEDULER_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.4.0"
KV_EVENTS_PORT = 5557  # where llm-d's indexer binds its ZMQ SUB socket (its default)
KV_EVENTS_PORT_NAME = "kv-events"
TOPIC_PREFIX = "kv@"  # the indexer's topic filter
DEFAULT_HASH_SEED = "42"  # llm-d's samples'; the same on both sides
MAX_HASH_SEED = 4294967295  # the largest PYTHONHASHSEED Python accepts
PRECISE_HASH_ALGO = "sha256_cbor"  # the hash llm-d's indexer recomputes
# The engine's own default (runtime/engine/engine_config.py's DEFAULT_BLOCK_SIZE), written out on
# both sides with precise routing: the indexer chunks prompts by it.
PRECISE_DEFAULT_BLOCK_SIZE = 16


def scorers(routing: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(routing.get("scorers") or DEFAULT_SCORERS)


def precise_scorer(routing: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The precise-prefix-cache-scorer entry of spec.routing.scorers, if routing uses it."""
    if not routing:
        return None
    return next((item for item in scorers(routing) if item["type"] == PRECISE), None)


def hash_seed(scorer: Mapping[str, Any]) -> str:
    return str(scorer.get("hashSeed", DEFAULT_HASH_SEED))


def precise_block_size(spec: Mapping[str, Any]) -> int:
    return int((spec.get("engine") or {}).get("blockSize") or PRECISE_DEFAULT_BLOCK_SIZE)


def _plugin(item: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    if item["type"] != PRECISE:
        return {"type": item["type"]}
    return {
        "type": PRECISE,
        "parameters": {
            "indexerConfig": {
                "tokenProcessorConfig": {
                    "blockSize": precise_block_size(spec),
                    "hashSeed": hash_seed(item),
                },
                # kvcache_index_* on the picker's metrics port: the blocks it has indexed.
                "kvBlockIndexConfig": {"enableMetrics": True},
            },
            "kvEventsConfig": {
                "zmqEndpoint": f"tcp://*:{KV_EVENTS_PORT}",
                "topicFilter": TOPIC_PREFIX,
            },
        },
    }


# llm-d's P/D plugins (its inference scheduler): the profile handler runs the decode profile,
# then the prefill one; each profile keeps the pods of its role (label llm-d.ai/role) and scores
# them; the pre-request handler names the chosen prefill pod in the x-prefiller-host-port header
# the decode pod's routing sidecar reads.
PD_PROFILE_HANDLER = "pd-profile-handler"
PREFILL_HEADER_HANDLER = "prefill-header-handler"
ROLE_FILTERS = {"prefill": "prefill-filter", "decode": "decode-filter"}
MAX_SCORE_PICKER = "max-score-picker"


def pd_picker_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The EndpointPickerConfig with a prefill role: a prefill and a decode profile, each its
    role's filter, the scorers weighted, the max-score picker; every request gets both (the
    handler's threshold 0: the prefill role computes every prompt)."""
    chosen = scorers(spec["routing"])
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": PREFILL_HEADER_HANDLER},
            *(_plugin(item, spec) for item in chosen),
            *({"type": role_filter} for role_filter in ROLE_FILTERS.values()),
            {"type": MAX_SCORE_PICKER},
            {"type": PD_PROFILE_HANDLER},
        ],
        "schedulingProfiles": [
            {
                "name": role,
                "plugins": [
                    {"pluginRef": role_filter},
                    {"pluginRef": MAX_SCORE_PICKER},
                    *({"pluginRef": item["type"], "weight": item["weight"]} for item in chosen),
                ],
            }
            for role, role_filter in ROLE_FILTERS.items()
        ],
    }


def uses_llmd_scheduler(spec: Mapping[str, Any]) -> bool:
    """Whether the picker is llm-d's inference scheduler (LLMD_SCHEDULER_IMAGE), not the
    Inference Extension's: the precise scorer and the P/D profiles are its plugins."""
    return bool(precise_scorer(spec.get("routing")) or spec.get("prefill"))


def flow_control(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """routing.flowControl with its defaults, when the picker holds requests: asked for, or
    needed because the service scales to zero (a request then waits for the first replica)."""
    routing = spec.get("routing") or {}
    scales_to_zero = (spec.get("autoscaling") or {}).get("minReplicas") == 0
    if uses_llmd_scheduler(spec) or (routing.get("flowControl") is None and not scales_to_zero):
        # llm-d's scheduler (v0.4.0) fails a request at zero endpoints before its flow control.
        return None
    return {
        "holdSeconds": DEFAULT_HOLD_SECONDS,
        "maxHeldRequests": DEFAULT_MAX_HELD_REQUESTS,
        **(routing.get("flowControl") or {}),
    }


def picker_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The picker's EndpointPickerConfig: one plugin per scorer, weighted in the default
    profile (the picker adds its single-profile handler and max-score picker itself), and its
    flow control when requests are held; with spec.prefill, the P/D profiles."""
    if spec.get("prefill"):
        return pd_picker_config(spec)
    chosen = scorers(spec["routing"])
    config: dict[str, Any] = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [_plugin(item, spec) for item in chosen],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": item["type"], "weight": item["weight"]} for item in chosen
                ],
            }
        ],
    }
    held = flow_control(spec)
    if held is not None:
        config["featureGates"] = [FLOW_CONTROL_GATE]
        config["flowControl"] = {
            "maxRequests": str(held["maxHeldRequests"]),
            "defaultRequestTTL": f"{held['holdSeconds']}s",
        }
    return config


def kv_events_endpoint(picker: str) -> str:
    # The picker's Service by its short name: it is in the pods' namespace (their DNS search path).
    return f"tcp://{picker}:{KV_EVENTS_PORT}"


def with_precise_routing(
    spec: Mapping[str, Any], *, picker: str, served_name: str
) -> Mapping[str, Any]:
    """The spec with what precise routing sets on every serving pod: KV events published to the
    picker's indexer under the pod's topic, hashed as the indexer hashes (sha256_cbor, its seed,
    its block size). Admission keeps these fields the operator's; without the precise scorer the
    spec is returned as it is."""
    scorer = precise_scorer(spec.get("routing"))
    if scorer is None:
        return spec
    engine = {
        **(spec.get("engine") or {}),
        "blockSize": precise_block_size(spec),
        "prefixCachingHashAlgo": PRECISE_HASH_ALGO,
        "kvEventsConfig": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": kv_events_endpoint(picker),
            # $(POD_IP): the kubelet substitutes the pod's address (the env var below). The
            # address alone, no port: llm-d's scorer matches it to the pool's pod address.
            "topic": f"{TOPIC_PREFIX}$(POD_IP)@{served_name}",
        },
    }
    env = [
        *(spec.get("env") or []),
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PYTHONHASHSEED", "value": hash_seed(scorer)},
    ]
    return {**spec, "engine": engine, "env": env}
