"""The OpenAPI schema of everything in an InferenceService except `spec.engine`/`engineEnv`.

The engine parts come from the server-argument schema (engine_schema.py); this module holds the
Kubernetes-facing fields: what to run, where, how big, how it is reached and scraped.
"""

from infernetes.operator import names
from infernetes.operator.openapi import (
    DNS_SUBDOMAIN_PATTERN,
    Schema,
    array,
    boolean,
    enum,
    free_object,
    integer,
    number,
    obj,
    quantity,
    rule,
    string,
    string_map,
)
from infernetes.operator.picker_config import (
    APPROXIMATE,
    DEFAULT_EPP_IMAGE,
    DEFAULT_HASH_SEED,
    DEFAULT_HOLD_SECONDS,
    DEFAULT_MAX_HELD_REQUESTS,
    LLMD_SCHEDULER_IMAGE,
    MAX_HASH_SEED,
    MAX_WEIGHT,
    PRECISE,
    PRECISE_HASH_ALGO,
    SCORER_TYPES,
)

from infernetes.schema.args import BY_NAME

GPU_VENDORS = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
MONITORING_MODES = ["auto", "serviceMonitor", "podMonitor", "annotations", "none"]
ROLLOUT_STRATEGIES = ["Auto", "RollingUpdate", "Recreate"]
SERVICE_TYPES = ["ClusterIP", "NodePort", "LoadBalancer"]
# Variables only a Secret reference may set.
SECRET_ONLY_ENV = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]
# Names of variables that hold secrets (OPENAI_API_KEY, WANDB_TOKEN, DB_PASSWORD, ...): a plain
# value would sit in the resource and the pod spec for anyone who can read them.
SECRET_NAME_PATTERN = r"(?i)(^|_)(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|ACCESS_KEY|PRIVATE_KEY)$"
PVC_MODEL_PATTERN = r"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^/].*$"
# A LoRA adapter's source: a Hugging Face id, or cache://<path inside spec.modelCache's volume>
LORA_HUB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
LORA_CACHE_PATTERN = r"^cache://[^/].*$"
LORA_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# --max-lora-rank as the server-argument schema declares it (its choices, its default).
MAX_LORA_RANK = BY_NAME["max-lora-rank"]
MAX_LORA_ADAPTERS = 64
TERMINATION_GRACE_SECONDS = 60
# What a GPU pod requests of its host per GPU unless spec.resources says otherwise
# (render.workload.host_requests says why).
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 16
# How much of the grace period the server's drain leaves for aborting what is left, stopping the
# engine and exiting, when spec.engine.shutdownTimeout is unset.
SHUTDOWN_MARGIN_SECONDS = 10
# A terminating pod keeps serving this long before its server is told to drain: the endpoints,
# Services' proxies and the endpoint picker stop sending to it first. That takes the endpoint
# controller's update (retried after 1 s, 2 s, 4 s when its cache is stale, as under load),
# then each proxy's or gateway's own sync (kube-proxy's at most once a second, load balancers
# and gateways that poll, several seconds); 5 s let a loaded client keep sending to a draining
# pod (e2e/test_serving_changes.py). At most a sixth of the grace period (none below 6 s).
PRE_STOP_SECONDS = 10
# The startup probe asks at least this often: a pod whose engine has loaded becomes Ready (and
# takes its share of traffic, or lets a rolling update go on) within seconds, not a whole
# spec.probes.periodSeconds. A /health request costs the server next to nothing.
STARTUP_PROBE_PERIOD_SECONDS = 2


def pre_stop_seconds(grace: int) -> int:
    return min(PRE_STOP_SECONDS, grace // 6)


def pre_stop_seconds_cel(grace: str) -> str:
    """pre_stop_seconds as a CEL expression of `grace`."""
    return f"({grace} / 6 < {PRE_STOP_SECONDS} ? {grace} / 6 : {PRE_STOP_SECONDS})"


def _name(description: str) -> Schema:
    return string(description, maxLength=253, pattern=DNS_SUBDOMAIN_PATTERN)


def secret_key_ref(description: str, default_key: str) -> Schema:
    return obj(
        {
            "name": _name("Name of the Secret in the resource's namespace."),
            "key": string(
                f"Key inside the Secret (default {default_key!r}).",
                maxLength=253,
                default=default_key,
            ),
        },
        required=["name"],
        description=description,
    )


def env_var_schema() -> Schema:
    return obj(
        {
            "name": string("Variable name.", minLength=1, maxLength=256),
            "value": string(maxLength=32768),
            "valueFrom": free_object(
                "A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, ...)."
            ),
        },
        required=["name"],
    )


def env_from_schema() -> Schema:
    ref = obj({"name": _name("Name of the object."), "optional": boolean()}, required=["name"])
    return obj(
        {"prefix": string(maxLength=256), "configMapRef": ref, "secretRef": ref},
        rules=[
            rule(
                "has(self.configMapRef) != has(self.secretRef)",
                "exactly one of configMapRef and secretRef must be set",
            )
        ],
    )


def toleration_schema() -> Schema:
    return obj(
        {
            "key": string(maxLength=316),
            "operator": enum(["Exists", "Equal"]),
            "value": string(maxLength=63),
            "effect": enum(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
            "tolerationSeconds": integer(format="int64"),
        }
    )


def resources_schema() -> Schema:
    quantities = {
        "type": "object",
        "additionalProperties": quantity(),
        "maxProperties": 32,
    }
    return obj(
        {"requests": quantities, "limits": quantities},
        description="Container resources, merged over what the operator computes: the GPUs, and "
        f"for a GPU pod requests of {CPU_PER_GPU} CPUs and {MEMORY_PER_GPU_GIB}Gi of memory per GPU.",
        rules=[
            rule(
                "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits)"
                " || quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
                "a request must not exceed its limit",
                field_path=".requests",
            )
        ],
    )


def gpu_schema() -> Schema:
    return obj(
        {
            "vendor": enum(
                list(GPU_VENDORS), "Device plugin resource to request.", default="nvidia"
            ),
            "count": integer(
                "GPUs per replica; default tensor x pipeline x data parallel size (0 for device cpu).",
                minimum=0,
                maximum=64,
            ),
            "product": string(
                "Only schedule on nodes with this GPU product label (e.g. NVIDIA-H100-80GB-HBM3).",
                maxLength=63,
            ),
            "perNode": integer(
                "GPUs per node (default: the largest GPU node's capacity, as the operator sees "
                "the nodes). A replica whose tensorParallelSize x pipelineParallelSize exceeds it "
                "spans that many GPUs / perNode nodes, one pod each holding perNode GPUs: a "
                "LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, its controller must be installed) "
                "instead of a Deployment, the Service selecting the leaders.",
                minimum=1,
                maximum=64,
            ),
            "deviceClassName": _name(
                "Claim the GPUs through Dynamic Resource Allocation (resource.k8s.io/v1, "
                "Kubernetes 1.34+) instead of the vendor's device-plugin resource: the operator "
                "renders a ResourceClaimTemplate asking for exactly `count` devices of this "
                "DeviceClass (e.g. gpu.nvidia.com), and each pod gets a claim of its own."
            ),
            "resourceClaimTemplateName": _name(
                "Claim the GPUs through Dynamic Resource Allocation from this existing "
                "ResourceClaimTemplate in the resource's namespace (its requests say which "
                "devices and how many) instead of the vendor's device-plugin resource."
            ),
        },
        rules=[
            rule(
                "!has(self.deviceClassName) || !has(self.resourceClaimTemplateName)",
                "name gpu.deviceClassName (the operator renders the claim template) or "
                "gpu.resourceClaimTemplateName (yours), not both",
                field_path=".resourceClaimTemplateName",
            ),
            rule(
                "!(has(self.deviceClassName) || has(self.resourceClaimTemplateName)) || "
                "!has(self.perNode)",
                "gpu.perNode (a replica across nodes) claims device-plugin GPUs; with Dynamic "
                "Resource Allocation a replica stays on one node (planned)",
                field_path=".perNode",
            ),
        ],
    )


def model_cache_schema() -> Schema:
    return obj(
        {
            "claimName": _name(
                "PersistentVolumeClaim mounted as the Hugging Face cache (HF_HOME). Unless "
                "readOnly, it also keeps Triton's compiled kernels (TRITON_CACHE_DIR), so a new "
                "pod starts without compiling them again."
            ),
            "subPath": string(maxLength=1024),
            "readOnly": boolean(),
            "download": {
                **boolean(),
                "description": "Download the model (a Hugging Face id) into the claim with a Job before the "
                "server starts: the Deployment is created once the Job has succeeded (condition "
                "ModelCached), so replicas and restarts find it in the cache. A changed model, "
                "revision or engine.ignorePatterns runs a new Job. The token comes only from "
                "hfTokenSecretRef.",
            },
        },
        required=["claimName"],
        rules=[
            rule(
                "!(has(self.download) && self.download && has(self.readOnly) && self.readOnly)",
                "modelCache.download writes into the claim: modelCache.readOnly must not be true",
                field_path=".download",
            )
        ],
    )


def lora_schema() -> Schema:
    adapter = obj(
        {
            "name": string(
                "The name clients send as the request's model.",
                minLength=1,
                maxLength=128,
                pattern=LORA_NAME_PATTERN,
            ),
            "source": string(
                "A Hugging Face id (org/name, downloaded into the model cache at startup) or "
                "cache://<path inside spec.modelCache's volume>.",
                minLength=1,
                maxLength=512,
            ),
        },
        required=["name", "source"],
        rules=[
            rule(
                f"self.source.matches('{LORA_HUB_PATTERN}') || "
                f"self.source.matches('{LORA_CACHE_PATTERN}')",
                "source must be a Hugging Face id (org/name) or cache://<path inside the model "
                "cache volume>",
                field_path=".source",
            )
        ],
    )
    adapters = array(
        adapter,
        max_items=MAX_LORA_ADAPTERS,
        description="The adapters every replica serves (--lora-modules); changing the list "
        "rolls the pods.",
    )
    adapters["x-kubernetes-list-type"] = "map"  # names are unique
    adapters["x-kubernetes-list-map-keys"] = ["name"]
    return obj(
        {
            "adapters": adapters,
            "maxRank": integer(
                "Largest adapter rank served (--max-lora-rank; the runtime's default "
                f"{MAX_LORA_RANK.default}).",
                enum=list(MAX_LORA_RANK.choices or ()),
            ),
        },
        required=["adapters"],
        description="LoRA adapters served beside the model (--enable-lora, --lora-modules, "
        "--max-loras as many as adapters, --max-lora-rank).",
    )


def profile_schema() -> Schema:
    """A seccompProfile or an appArmorProfile."""
    return obj(
        {
            "type": enum(["RuntimeDefault", "Localhost", "Unconfined"]),
            "localhostProfile": string(maxLength=4096),
        },
        required=["type"],
    )


def se_linux_options_schema() -> Schema:
    return obj({field: string(maxLength=253) for field in ("user", "role", "type", "level")})


def _ids() -> dict[str, Schema]:
    """The identity fields a pod and a container security context share."""
    return {
        "runAsUser": integer(format="int64", minimum=0),
        "runAsGroup": integer(format="int64", minimum=0),
        "runAsNonRoot": boolean(),
        "seccompProfile": profile_schema(),
        "appArmorProfile": profile_schema(),
        "seLinuxOptions": se_linux_options_schema(),
    }


def pod_security_context_schema() -> Schema:
    sysctl = obj(
        {"name": string(minLength=1, maxLength=253), "value": string(maxLength=4096)},
        required=["name", "value"],
    )
    return obj(
        {
            **_ids(),
            "fsGroup": integer(format="int64", minimum=0),
            "fsGroupChangePolicy": enum(["OnRootMismatch", "Always"]),
            "supplementalGroups": array(integer(format="int64", minimum=0), max_items=32),
            "sysctls": array(sysctl, max_items=32),
        },
        description="The pod's securityContext, merged field by field over the operator's "
        f"(uid/gid/fsGroup {names.RUNTIME_UID}, runAsNonRoot, seccomp RuntimeDefault: "
        "the restricted Pod Security Standard).",
    )


def container_security_context_schema() -> Schema:
    capability_list = array(string(minLength=1, maxLength=64), max_items=64)
    return obj(
        {
            **_ids(),
            "allowPrivilegeEscalation": boolean(),
            "privileged": boolean(),
            "readOnlyRootFilesystem": boolean(),
            "procMount": enum(["Default", "Unmasked"]),
            "capabilities": obj({"add": capability_list, "drop": capability_list}),
        },
        description="The server container's securityContext, merged field by field over the "
        "operator's (no privilege escalation, all capabilities dropped, read-only root "
        "filesystem with writable /tmp, home and cache volumes).",
    )


def probes_schema() -> Schema:
    return obj(
        {
            "startupTimeoutSeconds": integer(
                "How long a replica may take to load the model before it is restarted.",
                minimum=10,
                maximum=86400,
                default=1800,
            ),
            "periodSeconds": integer(
                "How often the readiness and liveness probes run; the startup probe runs every "
                f"{STARTUP_PROBE_PERIOD_SECONDS} s at most, so that a replica serves as soon as "
                "its model is loaded.",
                minimum=1,
                maximum=300,
                default=10,
            ),
            "timeoutSeconds": integer(minimum=1, maximum=300, default=5),
            "failureThreshold": integer(
                "Failed readiness/liveness checks in a row before acting.",
                minimum=1,
                maximum=100,
                default=3,
            ),
        }
    )


def service_schema() -> Schema:
    return obj(
        {
            "type": enum(SERVICE_TYPES, default="ClusterIP"),
            "port": integer(minimum=1, maximum=65535, default=8000),
            "annotations": string_map(),
        }
    )


def monitoring_schema() -> Schema:
    return obj(
        {
            "mode": enum(
                MONITORING_MODES,
                "auto: ServiceMonitor if the Prometheus operator's API is served, else PodMonitor, "
                "else prometheus.io annotations.",
                default="auto",
            ),
            "interval": string(
                "Scrape interval.", pattern=r"^[0-9]+(ms|s|m|h)$", maxLength=16, default="30s"
            ),
            "labels": string_map(
                "Extra labels for the ServiceMonitor/PodMonitor (to match a Prometheus)."
            ),
        }
    )


# The Gateway API's own patterns for an object name, a namespace and a listener's section name.
GATEWAY_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
GATEWAY_DURATION_PATTERN = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"
MAX_PARENT_REFS = 32  # an HTTPRoute's limit


def gateway_schema() -> Schema:
    ref = obj(
        {
            "name": string(
                "Name of the Gateway.", minLength=1, maxLength=253, pattern=GATEWAY_NAME_PATTERN
            ),
            "namespace": string(
                "Namespace of the Gateway (default: this resource's; a Gateway elsewhere must "
                "allow routes from this namespace in its listeners' allowedRoutes).",
                minLength=1,
                maxLength=63,
                pattern=NAMESPACE_PATTERN,
            ),
            "sectionName": string(
                "Name of one listener of the Gateway to attach to (default: all that allow it).",
                minLength=1,
                maxLength=253,
                pattern=GATEWAY_NAME_PATTERN,
            ),
        },
        required=["name"],
    )
    # No uniqueness rule: a CEL rule comparing every pair costs far over the API server's budget;
    # the HTTPRoute's own validation refuses a Gateway listed twice (Degraded names it).
    refs = array(
        ref,
        max_items=MAX_PARENT_REFS,
        description="The Gateways (gateway.networking.k8s.io/v1) the HTTPRoute attaches to: "
        "its parentRefs.",
    )
    refs["minItems"] = 1
    return obj(
        {
            "refs": refs,
            "requestTimeout": string(
                "How long the Gateway waits for a whole response (the route's "
                "timeouts.request, a Gateway API duration such as 300s or 1h; 0s: no limit).",
                maxLength=32,
                pattern=GATEWAY_DURATION_PATTERN,
                default="300s",
            ),
        },
        required=["refs"],
        description="An HTTPRoute <name> (gateway.networking.k8s.io/v1) from these existing "
        "Gateways to the InferencePool, every path, owned by this resource. Needs the Gateway "
        "API's CRDs: without them the Routing condition is HTTPRouteMissing and the pool is "
        "there for a route of your own.",
    )


def scorers_schema() -> Schema:
    scorer = obj(
        {
            "type": enum(
                list(SCORER_TYPES),
                f"{PRECISE}: the pod whose KV cache holds the prompt's longest prefix, as the "
                "pods' KV events tell llm-d's indexer in the picker; "
                f"{APPROXIMATE}: the pod the picker last sent that prefix to; queue-scorer: the "
                "shortest queue; kv-cache-utilization-scorer: the emptiest KV cache.",
            ),
            "weight": integer(
                "The scorer's weight in the picker's scheduling profile.",
                minimum=1,
                maximum=MAX_WEIGHT,
            ),
            "hashSeed": string(
                f"{PRECISE} only: the seed of the block hashes (the indexer's hashSeed and "
                f"every pod's PYTHONHASHSEED, which Python takes from 0 to {MAX_HASH_SEED}; "
                f"default {DEFAULT_HASH_SEED}).",
                minLength=1,
                maxLength=len(str(MAX_HASH_SEED)),
                pattern="^[0-9]+$",
            ),
        },
        required=["type", "weight"],
        rules=[
            rule(
                f"!has(self.hashSeed) || self.type == '{PRECISE}'",
                f"hashSeed applies to the {PRECISE} only",
                field_path=".hashSeed",
            ),
            rule(
                f"!has(self.hashSeed) || int(self.hashSeed) <= {MAX_HASH_SEED}",
                f"hashSeed must be at most {MAX_HASH_SEED} (Python refuses a larger "
                "PYTHONHASHSEED at startup)",
                field_path=".hashSeed",
            ),
        ],
    )
    return array(
        scorer,
        max_items=len(SCORER_TYPES),
        description="The picker's scorers and their weights (its EndpointPickerConfig's "
        "default scheduling profile; default: queue-scorer 2, kv-cache-utilization-scorer 2, "
        f"{APPROXIMATE} 3). With the {PRECISE} the picker is llm-d's inference scheduler and "
        "every serving pod publishes its KV-cache events to it (engine.kvEventsConfig, "
        f"prefixCachingHashAlgo {PRECISE_HASH_ALGO}, blockSize and PYTHONHASHSEED are the "
        "operator's then).",
        rules=[
            rule("size(self) > 0", "scorers must name at least one scorer"),
            rule(
                "self.all(a, self.exists_one(b, b.type == a.type))",
                "each scorer type may be listed once",
            ),
            rule(
                f"!(self.exists(s, s.type == '{PRECISE}') && "
                f"self.exists(s, s.type == '{APPROXIMATE}'))",
                f"choose one prefix scorer: {PRECISE} or {APPROXIMATE}",
            ),
        ],
    )


# With precise routing the pods' KV events, hash and seed are the operator's.
PRECISE_ROUTING = (
    f"has(self.routing) && has(self.routing.scorers) && "
    f"self.routing.scorers.exists(s, s.type == '{PRECISE}')"
)
# The picker is llm-d's inference scheduler (picker_config.uses_llmd_scheduler, in CEL).
LLMD_PICKER = f"({PRECISE_ROUTING}) || has(self.prefill)"
PRECISE_ROUTING_RULES = [
    rule(
        f"!({PRECISE_ROUTING}) || !has(self.engine) || !has(self.engine.enablePrefixCaching) || "
        "self.engine.enablePrefixCaching",
        f"routing.scorers {PRECISE} routes by the pods' cached prefixes: "
        "engine.enablePrefixCaching must not be false",
        field_path=".engine.enablePrefixCaching",
    ),
    rule(
        f"!({PRECISE_ROUTING}) || !has(self.engine) || !has(self.engine.kvEventsConfig)",
        f"with routing.scorers {PRECISE} the operator sets engine.kvEventsConfig (the pods "
        "publish to the picker's indexer): leave it unset",
        field_path=".engine.kvEventsConfig",
    ),
    rule(
        f"!({PRECISE_ROUTING}) || !has(self.engine) || "
        f"!has(self.engine.prefixCachingHashAlgo) || "
        f"self.engine.prefixCachingHashAlgo == '{PRECISE_HASH_ALGO}'",
        f"with routing.scorers {PRECISE} engine.prefixCachingHashAlgo must be "
        f"{PRECISE_HASH_ALGO} (the hash llm-d's indexer recomputes) or unset",
        field_path=".engine.prefixCachingHashAlgo",
    ),
    rule(
        f"!({PRECISE_ROUTING}) || !has(self.engine) || !has(self.engine.dataParallelSize) || "
        "self.engine.dataParallelSize <= 1",
        f"with routing.scorers {PRECISE} engine.dataParallelSize must be 1: a data-parallel "
        "rank publishes its KV events on the endpoint's port plus its rank, where the picker's "
        "indexer does not listen",
        field_path=".engine.dataParallelSize",
    ),
    rule(
        f"!({PRECISE_ROUTING}) || !has(self.env) || "
        "!self.env.exists(e, e.name == 'PYTHONHASHSEED')",
        f"with routing.scorers {PRECISE} PYTHONHASHSEED is the scorer's hashSeed: set it there",
        field_path=".env",
    ),
    rule(
        f"!({LLMD_PICKER}) || !has(self.routing.flowControl)",
        f"routing.flowControl needs the Inference Extension's picker: with routing.scorers "
        f"{PRECISE} or spec.prefill the picker is llm-d's scheduler ({LLMD_SCHEDULER_IMAGE}), "
        "which refuses a request when no pod is ready rather than holding it",
        field_path=".routing.flowControl",
    ),
    rule(
        f"!({LLMD_PICKER}) || !has(self.routing.splits)",
        f"routing.splits needs the Inference Extension's picker: with routing.scorers {PRECISE} "
        f"or spec.prefill the picker is llm-d's scheduler ({LLMD_SCHEDULER_IMAGE}), which does "
        "not read InferenceModelRewrites",
        field_path=".routing.splits",
    ),
]

MAX_SPLIT_TARGETS = 16
MAX_SPLIT_WEIGHT = 1000000  # the InferenceModelRewrite's own limit


def splits_schema() -> Schema:
    target = obj(
        {
            "target": string(
                "Where the share goes: this InferenceService's name (its served model) or the "
                "name of one of its spec.lora adapters.",
                minLength=1,
                maxLength=128,
                pattern=LORA_NAME_PATTERN,
            ),
            "weight": integer(
                "The target's share is weight / the sum of the weights (0: none).",
                minimum=0,
                maximum=MAX_SPLIT_WEIGHT,
            ),
        },
        required=["target", "weight"],
    )
    splits = array(
        target,
        max_items=MAX_SPLIT_TARGETS,
        description="A weighted split of the requests for the served model name (canaries, "
        "blue/green between adapters): the endpoint picker rewrites each request's model to a "
        "target drawn by weight (an InferenceModelRewrite <name> of the pool). status."
        "trafficSplit shows the split in force.",
        rules=[
            rule(
                "self.exists(s, s.weight > 0)",
                "routing.splits: the weights must sum to more than 0",
            )
        ],
    )
    splits["minItems"] = 1
    splits["x-kubernetes-list-type"] = "map"  # each target once
    splits["x-kubernetes-list-map-keys"] = ["target"]
    return splits


def flow_control_schema() -> Schema:
    return obj(
        {
            "holdSeconds": integer(
                "How long a request may wait in the picker for a pod (then 503).",
                minimum=1,
                maximum=3600,
                default=DEFAULT_HOLD_SECONDS,
            ),
            "maxHeldRequests": integer(
                "How many requests may wait at once (more are refused with 429).",
                minimum=1,
                maximum=1000000,
                default=DEFAULT_MAX_HELD_REQUESTS,
            ),
        },
        description="The endpoint picker's flow control: a request no pod can take (none is "
        "ready, as at zero replicas, or all are saturated) waits in the picker up to "
        "holdSeconds, instead of being refused at once. On by default with "
        "autoscaling.minReplicas 0, so the first request after zero waits for the replica it "
        "wakes. Keep holdSeconds below the Gateway's request timeout.",
    )


def routing_schema() -> Schema:
    return obj(
        {
            "endpointPicker": obj(
                {
                    "image": string(
                        f"The endpoint picker's image (default {DEFAULT_EPP_IMAGE}; with "
                        f"the {PRECISE} llm-d's inference scheduler, {LLMD_SCHEDULER_IMAGE}).",
                        minLength=1,
                        maxLength=512,
                    ),
                    "resources": resources_schema(),
                },
                description="The Gateway API Inference Extension's endpoint picker (EPP), run as "
                "one Deployment <name>-epp with a Service of that name.",
            ),
            "gateway": gateway_schema(),
            "scorers": scorers_schema(),
            "splits": splits_schema(),
            "flowControl": flow_control_schema(),
            "failureMode": enum(
                ["FailClose", "FailOpen"],
                "What the Gateway does when the endpoint picker does not answer: refuse the "
                "request, or send it to a pod of its own choosing.",
                default="FailClose",
            ),
        },
        description="Route by model with queue-, KV-cache- and prefix-aware picking: when the "
        "cluster serves the Gateway API Inference Extension (inference.networking.k8s.io/v1), "
        "an InferencePool <name> selecting the serving pods on port 8000, and its endpoint "
        "picker; with gateway.refs also the HTTPRoute from those Gateways to the pool. Without "
        "the extension's CRDs the Routing condition says so and the Service serves as before.",
    )


AUTOSCALING_MAX_WINDOW_SECONDS = 3600  # the HPA's own limit on a stabilization window
DEFAULT_SCALE_DOWN_SECONDS = 300
# A Prometheus server's base URL, as KEDA's prometheus trigger takes it.
PROMETHEUS_ADDRESS_PATTERN = r"^https?://[^\s/]+(/[^\s]*)?$"


def keda_schema() -> Schema:
    return obj(
        {
            "prometheusServerAddress": string(
                "Base URL of the Prometheus server KEDA queries (e.g. "
                "http://prometheus-operated.monitoring.svc:9090).",
                maxLength=512,
                pattern=PROMETHEUS_ADDRESS_PATTERN,
            ),
            "activationQueuedRequests": integer(
                "With minReplicas 0: the queue trigger counts as active, keeping the service from "
                "scaling to zero, while more requests than this wait in its engines "
                "(vllm:num_requests_waiting summed over the replicas). At zero no engine reports "
                "any: spec.routing's endpoint picker is what wakes the service.",
                minimum=0,
                maximum=100000,
                default=0,
            ),
        },
        required=["prometheusServerAddress"],
        description="Used when the cluster serves KEDA's ScaledObject API (keda.sh/v1alpha1): a "
        "ScaledObject with Prometheus triggers then scales the service, down to zero if "
        "minReplicas is 0.",
    )


LATENCY_DEFAULT_PERCENTILE = 90
LATENCY_DEFAULT_WINDOW_SECONDS = 120


def latency_schema() -> Schema:
    return obj(
        {
            "ttftSeconds": number(
                "Target time to first token, in seconds, at `percentile` over the replicas "
                "(vllm:time_to_first_token_seconds).",
                minimum=0.001,
                maximum=3600,
            ),
            "interTokenSeconds": number(
                "Target time between output tokens, in seconds, at `percentile` over the "
                "replicas (vllm:inter_token_latency_seconds).",
                minimum=0.0001,
                maximum=60,
            ),
            "percentile": integer(
                "The percentile the targets hold for.",
                minimum=50,
                maximum=99,
                default=LATENCY_DEFAULT_PERCENTILE,
            ),
            "windowSeconds": integer(
                "The window the percentile is taken over.",
                minimum=30,
                maximum=AUTOSCALING_MAX_WINDOW_SECONDS,
                default=LATENCY_DEFAULT_WINDOW_SECONDS,
            ),
        },
        description="Latency targets: replicas scale in proportion to the measured percentile "
        "over its target (HPA semantics: ceil(replicas x measured / target)), together with the "
        "queue and KV-cache targets (the largest count wins).",
        rules=[
            rule(
                "has(self.ttftSeconds) || has(self.interTokenSeconds)",
                "autoscaling.latency needs ttftSeconds and/or interTokenSeconds",
                field_path=".ttftSeconds",
            )
        ],
    )


def autoscaling_schema() -> Schema:
    return obj(
        {
            "minReplicas": integer(
                "Fewest replicas; 0 (scale to zero) needs keda and targetQueuedRequests, and "
                "spec.routing to come back from zero on the requests that arrive.",
                minimum=0,
                maximum=1000,
                default=1,
            ),
            "maxReplicas": integer("Most replicas.", minimum=1, maximum=1000),
            "targetQueuedRequests": integer(
                "Target of vllm:num_requests_waiting per replica (requests queued in each "
                "engine, on average).",
                minimum=1,
                maximum=100000,
            ),
            "targetKVCacheUsagePercent": integer(
                "Target of vllm:kv_cache_usage_perc averaged over the replicas, in percent.",
                minimum=1,
                maximum=100,
            ),
            "scaleUpStabilizationSeconds": integer(
                "Scale up to the highest replica count recommended over this window.",
                minimum=0,
                maximum=AUTOSCALING_MAX_WINDOW_SECONDS,
                default=0,
            ),
            "scaleDownStabilizationSeconds": integer(
                "Scale down to the highest replica count recommended over this window (with "
                "KEDA and minReplicas 0 also the wait before scaling to zero).",
                minimum=0,
                maximum=AUTOSCALING_MAX_WINDOW_SECONDS,
                default=DEFAULT_SCALE_DOWN_SECONDS,
            ),
            "latency": latency_schema(),
            "keda": keda_schema(),
        },
        required=["maxReplicas"],
        description="Scale the replicas on the engines' queue and KV-cache usage: a KEDA "
        "ScaledObject when the cluster serves KEDA's API and keda is set, else an autoscaling/v2 "
        "HorizontalPodAutoscaler on the pods' custom metrics (vllm_num_requests_waiting, "
        "vllm_kv_cache_usage_perc, as prometheus-adapter exposes them). Either one targets this "
        "resource's scale subresource and so writes spec.replicas: leave spec.replicas out of "
        "applied manifests, as with a Deployment under an HPA.",
        rules=[
            rule(
                "self.maxReplicas >= self.minReplicas",
                "autoscaling.maxReplicas must be at least autoscaling.minReplicas",
                field_path=".maxReplicas",
            ),
            rule(
                "has(self.targetQueuedRequests) || has(self.targetKVCacheUsagePercent) || "
                "has(self.latency)",
                "autoscaling needs a target: targetQueuedRequests, targetKVCacheUsagePercent "
                "and/or latency",
                field_path=".targetQueuedRequests",
            ),
            rule(
                "self.minReplicas > 0 || has(self.keda)",
                "autoscaling.minReplicas 0 (scale to zero) needs autoscaling.keda: an HPA cannot "
                "scale to zero",
                field_path=".minReplicas",
            ),
            rule(
                "self.minReplicas > 0 || has(self.targetQueuedRequests)",
                "autoscaling.minReplicas 0 needs targetQueuedRequests: the service scales up "
                "from zero on queued requests",
                field_path=".targetQueuedRequests",
            ),
            rule(
                "!has(self.latency) || "
                f"(has(self.scaleDownStabilizationSeconds) ? self.scaleDownStabilizationSeconds : {DEFAULT_SCALE_DOWN_SECONDS}) >= "
                f"(has(self.latency.windowSeconds) ? self.latency.windowSeconds : {LATENCY_DEFAULT_WINDOW_SECONDS})",
                "autoscaling.scaleDownStabilizationSeconds must be at least latency.windowSeconds: "
                "a quiet spell shorter than the window must not drop replicas the load needs",
                field_path=".scaleDownStabilizationSeconds",
            ),
        ],
    )


def rollout_schema() -> Schema:
    return obj(
        {
            "strategy": enum(
                ROLLOUT_STRATEGIES,
                "Auto: RollingUpdate when a surge pod can get its GPUs, else Recreate.",
                default="Auto",
            )
        }
    )


def env_list_schema() -> Schema:
    secret_names = " || ".join(f"e.name == '{name}'" for name in SECRET_ONLY_ENV)
    item = env_var_schema()
    item["x-kubernetes-validations"] = [
        {
            "rule": f"!has(self.value) || !self.name.matches('{SECRET_NAME_PATTERN}')",
            "messageExpression": "'variable ' + self.name + ' looks like a secret: set it with "
            "valueFrom.secretKeyRef, not a plain value'",
        }
    ]
    return array(
        item,
        max_items=128,
        description="Other environment variables (VLLM_* ones are typed fields in engineEnv).",
        rules=[
            rule(
                "self.all(e, !e.name.startsWith('VLLM_'))",
                "VLLM_* variables are typed fields under spec.engineEnv, not spec.env",
            ),
            rule(
                f"self.all(e, !({secret_names}))",
                "the Hugging Face token comes only from spec.hfTokenSecretRef",
            ),
        ],
    )


def env_from_list_schema() -> Schema:
    return array(
        env_from_schema(),
        max_items=16,
        rules=[
            rule(
                "self.all(e, !has(e.prefix) || !e.prefix.startsWith('VLLM_'))",
                "VLLM_* variables are typed fields under spec.engineEnv, not spec.envFrom",
            )
        ],
    )


def platform_properties() -> dict[str, Schema]:
    """Every spec field except engine/engineEnv."""
    return {
        "model": string(
            "Hugging Face model id, pvc://<claim>/<path>, or a path inside the image.",
            minLength=1,
            maxLength=512,
            **{
                "x-kubernetes-validations": [
                    rule(
                        f"!self.startsWith('pvc://') || self.matches('{PVC_MODEL_PATTERN}')",
                        "a pvc:// model must look like pvc://<claim-name>/<path>",
                    )
                ]
            },
        ),
        "servedModelName": string(
            "The model name clients send (default: the model id or the path inside the claim).",
            minLength=1,
            maxLength=256,
        ),
        "replicas": integer(
            "Replicas; with spec.autoscaling the autoscaler sets it (through the scale "
            "subresource) and a value applied here lasts until its next decision.",
            minimum=0,
            maximum=1000,
            default=1,
        ),
        "image": string(
            "Container image (default: the operator's own release).", minLength=1, maxLength=512
        ),
        "imagePullPolicy": enum(["Always", "IfNotPresent", "Never"]),
        "resources": resources_schema(),
        "gpu": gpu_schema(),
        "shmSize": quantity(
            "Size of the memory-backed /dev/shm (default 2Gi per GPU when more than one)."
        ),
        "env": env_list_schema(),
        "envFrom": env_from_list_schema(),
        "nodeSelector": string_map(),
        "tolerations": array(toleration_schema(), max_items=32),
        "affinity": free_object("A Kubernetes Affinity."),
        "topologySpreadConstraints": array(
            free_object(
                "A Kubernetes TopologySpreadConstraint; without a labelSelector it spreads this "
                "resource's pods."
            ),
            max_items=8,
            description="How the replicas spread across nodes or zones.",
        ),
        "priorityClassName": _name("PriorityClass of the pods."),
        "runtimeClassName": _name("RuntimeClass of the pods."),
        "serviceAccountName": _name("ServiceAccount the pods run as."),
        "podAnnotations": string_map(),
        "podSecurityContext": pod_security_context_schema(),
        "securityContext": container_security_context_schema(),
        "imagePullSecrets": array(
            obj({"name": _name("Name of a docker-registry Secret.")}, required=["name"]),
            max_items=16,
            description="Secrets to pull the image with.",
        ),
        "podLabels": string_map(),
        "apiKeySecretRef": secret_key_ref(
            "Secret holding the API key clients must send.", "api-key"
        ),
        "hfTokenSecretRef": secret_key_ref(
            "Secret holding the Hugging Face token (HF_TOKEN).", "token"
        ),
        "modelCache": model_cache_schema(),
        "lora": lora_schema(),
        "probes": probes_schema(),
        "service": service_schema(),
        "monitoring": monitoring_schema(),
        "rollout": rollout_schema(),
        "autoscaling": autoscaling_schema(),
        "routing": routing_schema(),
        "terminationGracePeriodSeconds": integer(
            "Time a pod has to stop before it is killed. It keeps serving for a sixth of it (at "
            f"most {PRE_STOP_SECONDS} s, a preStop sleep) while traffic moves away, then the "
            "server drains in-flight requests for engine.shutdownTimeout seconds, by default "
            f"what is left minus {SHUTDOWN_MARGIN_SECONDS}, then aborts the rest and exits.",
            minimum=0,
            maximum=3600,
            default=TERMINATION_GRACE_SECONDS,
        ),
    }


SERVICE_NAME_MAX = 63 - len("infsvc-")

# Rules on the whole object: the name becomes a Service name (a DNS-1035 label), possibly prefixed.
# Rules across spec fields outside spec.engine (crd.spec_rules adds them).
CACHE_RULES = [
    rule(
        "!has(self.modelCache) || !has(self.modelCache.download) || !self.modelCache.download"
        " || !self.model.startsWith('pvc://')",
        "modelCache.download fetches a Hugging Face model: spec.model must not be a pvc:// path",
        field_path=".modelCache.download",
    )
]

ROOT_RULES = [
    rule(
        f"self.metadata.name.size() <= {SERVICE_NAME_MAX} && "
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        f"metadata.name must be a DNS-1035 label of at most {SERVICE_NAME_MAX} characters "
        "(it names the Service)",
        field_path=".metadata.name",
    ),
    rule(
        "!has(self.spec.routing) || !has(self.spec.routing.splits) || "
        "self.spec.routing.splits.all(s, s.target == self.metadata.name || "
        "(has(self.spec.lora) && self.spec.lora.adapters.exists(a, a.name == s.target)))",
        "routing.splits: each target must be this InferenceService's name (its served model) "
        "or the name of one of spec.lora.adapters (the picker rewrites within its own pool)",
        field_path=".spec.routing.splits",
    ),
]
