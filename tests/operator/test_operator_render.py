"""render(): the rules behind the golden files, checked one by one."""

import pytest
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.gpus import pod_gpus, spare_gpus
from infernetes.operator.render import SERVER, plan, render
from infernetes.operator.render.service import service_link_variables, service_name_for
from infernetes.operator.render.workload import gpus_per_replica, rollout_strategy
from infernetes.operator.spec_schema import STARTUP_PROBE_PERIOD_SECONDS

from infernetes.schema.parser import parse_serve_args

FACTS = ClusterFacts()


def deployment(spec: dict, facts: ClusterFacts = FACTS) -> dict:
    return render(spec, facts, name="m", namespace="ns")[0]


def pod(spec: dict) -> dict:
    return deployment(spec)["spec"]["template"]["spec"]


def test_render_is_pure_and_deterministic() -> None:
    spec = {"model": "x", "engine": {"tensorParallelSize": 2}}
    assert render(spec, FACTS, name="m", namespace="ns") == render(
        spec, FACTS, name="m", namespace="ns"
    )
    assert spec == {"model": "x", "engine": {"tensorParallelSize": 2}}


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        ({"model": "x"}, 1),
        ({"model": "x", "engine": {"device": "cpu"}}, 0),
        ({"model": "x", "engine": {"tensorParallelSize": 4}}, 4),
        ({"model": "x", "engine": {"tensorParallelSize": 2, "pipelineParallelSize": 2}}, 4),
        ({"model": "x", "engine": {"tensorParallelSize": 2, "dataParallelSize": 2}}, 4),
        ({"model": "x", "gpu": {"count": 8}, "engine": {"tensorParallelSize": 4}}, 8),
        ({"model": "x", "resources": {"limits": {"nvidia.com/gpu": 3}}}, 3),
    ],
)
def test_gpus_per_replica(spec: dict, gpus: int) -> None:
    assert gpus_per_replica(spec) == gpus
    resources = pod(spec)["containers"][0].get("resources", {})
    assert resources.get("limits", {}).get("nvidia.com/gpu", 0) == gpus
    assert resources.get("requests", {}).get("nvidia.com/gpu", 0) == gpus


def test_cpu_has_no_gpu_toleration_and_no_shm() -> None:
    spec = pod({"model": "x", "engine": {"device": "cpu"}})
    assert "tolerations" not in spec
    assert "dshm" not in {volume["name"] for volume in spec["volumes"]}


def test_shm_only_for_several_gpus_unless_asked() -> None:
    assert "dshm" not in {volume["name"] for volume in pod({"model": "x"})["volumes"]}
    volumes = pod({"model": "x", "engine": {"tensorParallelSize": 2}})["volumes"]
    assert volumes[0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    volumes = pod({"model": "x", "shmSize": "1Gi"})["volumes"]
    assert volumes[0]["emptyDir"]["sizeLimit"] == "1Gi"


def test_pod_hygiene() -> None:
    spec = pod({"model": "x"})
    assert spec["enableServiceLinks"] is False
    container = spec["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert (
        container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"]
        >= 1800
    )


def test_the_startup_probe_asks_often_so_a_loaded_replica_is_ready_promptly() -> None:
    container = pod({"model": "x"})["containers"][0]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] == STARTUP_PROBE_PERIOD_SECONDS < 10
    assert container["readinessProbe"]["periodSeconds"] == 10
    assert startup["failureThreshold"] * startup["periodSeconds"] == 1800
    # A shorter period the user asks for holds for the startup probe too.
    container = pod({"model": "x", "probes": {"periodSeconds": 1}})["containers"][0]
    assert container["startupProbe"]["periodSeconds"] == 1
    assert container["startupProbe"]["failureThreshold"] == 1800


def test_user_env_wins_and_names_stay_unique() -> None:
    env = pod(
        {
            "model": "x",
            "modelCache": {"claimName": "c"},
            "env": [{"name": "HF_HOME", "value": "/x"}],
        }
    )["containers"][0]["env"]
    assert [e for e in env if e["name"] == "HF_HOME"] == [{"name": "HF_HOME", "value": "/x"}]


def test_the_plan_names_its_workload_by_role() -> None:
    result = plan({"model": "x"}, FACTS, name="m", namespace="ns")
    assert result.roles == {SERVER: ("apps/v1", "Deployment", "m")}
    (deployment,) = [m for m in result.manifests if m["kind"] == "Deployment"]
    assert result.workloads == {SERVER: deployment}


def test_service_name_collision_rule() -> None:
    assert service_name_for("llama") == ("llama", None)
    assert service_name_for("vllm-x")[0] == "infsvc-vllm-x"
    name, reason = service_name_for("vllm")
    assert name == "infsvc-vllm" and "VLLM_PORT" in reason
    assert "VLLM_PORT" in service_link_variables("vllm", 8000)
    assert not any(v.startswith("VLLM_") for v in service_link_variables(name, 8000))
    result = plan({"model": "x"}, FACTS, name="vllm", namespace="ns")
    assert result.service_name == "infsvc-vllm" and result.warnings
    assert result.url == "http://infsvc-vllm.ns.svc:8000/v1"


def test_owner_references_when_uid_known() -> None:
    for manifest in render({"model": "x"}, FACTS, name="m", namespace="ns", uid="u-1"):
        (ref,) = manifest["metadata"]["ownerReferences"]
        assert (
            ref["uid"] == "u-1" and ref["controller"] is True and ref["kind"] == "InferenceService"
        )


def test_monitoring_choice() -> None:
    def kinds(facts: ClusterFacts, mode: str = "auto") -> list[str]:
        spec = {"model": "x", "monitoring": {"mode": mode}}
        return [m["kind"] for m in render(spec, facts, name="m", namespace="ns")]

    both = ClusterFacts.from_api_versions(["monitoring.coreos.com/v1"])
    assert kinds(both) == ["Deployment", "Service", "ServiceMonitor"]
    assert kinds(ClusterFacts.from_api_versions(["monitoring.coreos.com/v1/PodMonitor"])) == [
        "Deployment",
        "Service",
        "PodMonitor",
    ]
    assert kinds(FACTS) == ["Deployment", "Service"]
    assert kinds(both, "none") == ["Deployment", "Service"]
    assert kinds(both, "podMonitor")[-1] == "PodMonitor"
    result = plan(
        {"model": "x", "monitoring": {"mode": "serviceMonitor"}}, FACTS, name="m", namespace="ns"
    )
    assert "does not serve" in result.warnings[0]
    annotations = result.workloads[SERVER]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


@pytest.mark.parametrize(
    ("spec", "spare", "expected"),
    [
        ({"model": "x", "engine": {"device": "cpu"}}, None, "RollingUpdate"),
        ({"model": "x"}, None, "Recreate"),
        ({"model": "x"}, {"nvidia.com/gpu": 1}, "RollingUpdate"),
        ({"model": "x", "engine": {"tensorParallelSize": 4}}, {"nvidia.com/gpu": 2}, "Recreate"),
        ({"model": "x", "rollout": {"strategy": "Recreate"}}, {"nvidia.com/gpu": 8}, "Recreate"),
        ({"model": "x", "rollout": {"strategy": "RollingUpdate"}}, None, "RollingUpdate"),
    ],
)
def test_rollout_strategy(spec: dict, spare: dict | None, expected: str) -> None:
    assert rollout_strategy(spec, ClusterFacts(spare_gpus=spare))["type"] == expected


def test_auto_rollout_without_room_keeps_replicas_serving() -> None:
    strategy = rollout_strategy({"model": "x", "replicas": 3}, ClusterFacts(spare_gpus={}))
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }


def test_spare_gpus() -> None:
    nodes = {"a": {"nvidia.com/gpu": 8}, "b": {"nvidia.com/gpu": 8}}
    used = {"a": [{"nvidia.com/gpu": 8}], "b": [{"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 2}]}
    assert spare_gpus(nodes, used) == {"nvidia.com/gpu": 2}
    assert pod_gpus({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}, {}]}) == {
        "nvidia.com/gpu": 2
    }


def test_pvc_model_is_mounted_and_named_by_its_path() -> None:
    result = plan({"model": "pvc://store/org/model"}, FACTS, name="m", namespace="ns")
    container = result.workloads[SERVER]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "--model=/mnt/models/org/model"
    assert result.model_name == "org/model"
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in container[
        "volumeMounts"
    ]


def test_facts_from_api_versions() -> None:
    facts = ClusterFacts.from_api_versions(["monitoring.coreos.com/v1"])
    assert facts.serves("monitoring.coreos.com/v1", "ServiceMonitor")
    assert facts.serves("monitoring.coreos.com/v1", "PodMonitor")
    with pytest.raises(ValueError, match="group/version"):
        ClusterFacts.from_api_versions(["monitoring"])


@pytest.mark.parametrize(
    ("spec", "grace", "flag"),
    [
        ({"model": "x"}, 60, "--shutdown-timeout=40"),
        ({"model": "x", "terminationGracePeriodSeconds": 300}, 300, "--shutdown-timeout=280"),
        ({"model": "x", "terminationGracePeriodSeconds": 5}, 5, "--shutdown-timeout=0"),
        (
            {
                "model": "x",
                "terminationGracePeriodSeconds": 120,
                "engine": {"shutdownTimeout": 100},
            },
            120,
            "--shutdown-timeout=100",
        ),
    ],
)
def test_drain_ends_before_the_grace_period(spec: dict, grace: int, flag: str) -> None:
    """The server drains for engine.shutdownTimeout, else the grace period less the preStop
    sleep and a margin, so the kubelet's SIGKILL never cuts a drain short; the flag is rendered
    once either way."""
    rendered = pod(spec)
    assert rendered["terminationGracePeriodSeconds"] == grace
    args = rendered["containers"][0]["args"]
    assert [arg for arg in args if arg.startswith("--shutdown-timeout")] == [flag]
    sleep = (rendered["containers"][0].get("lifecycle") or {}).get("preStop", {})
    slept = sleep.get("sleep", {}).get("seconds", 0)
    assert parse_serve_args(args).shutdown_timeout + slept < max(grace, 1)


@pytest.mark.parametrize(("grace", "sleep"), [(60, 10), (300, 10), (30, 5), (12, 2), (5, 0)])
def test_a_terminating_pod_serves_through_a_pre_stop_sleep_before_it_drains(
    grace: int, sleep: int
) -> None:
    container = pod({"model": "x", "terminationGracePeriodSeconds": grace})["containers"][0]
    if sleep:
        assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": sleep}}}
    else:
        assert "lifecycle" not in container


def test_gpu_pods_request_host_cpu_and_memory_per_gpu_unless_overridden() -> None:
    def requests(spec: dict) -> dict:
        deployment = render(spec, ClusterFacts(), name="m", namespace="ns")[0]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return container.get("resources", {}).get("requests", {})

    assert requests({"model": "m", "gpu": {"count": 2}}) == {
        "nvidia.com/gpu": 2,
        "cpu": "8",
        "memory": "32Gi",
    }
    assert requests(
        {"model": "m", "gpu": {"count": 1}, "resources": {"requests": {"cpu": "1"}}}
    ) == {
        "nvidia.com/gpu": 1,
        "cpu": "1",
        "memory": "16Gi",
    }
    assert requests({"model": "m", "engine": {"device": "cpu"}}) == {}


def test_a_disruption_budget_only_with_more_than_one_replica() -> None:
    def kinds(replicas: int) -> list[str]:
        spec = {"model": "m", "replicas": replicas}
        return [m["kind"] for m in render(spec, ClusterFacts(), name="m", namespace="ns")]

    assert "PodDisruptionBudget" not in kinds(1)
    (budget,) = [
        m
        for m in render({"model": "m", "replicas": 3}, ClusterFacts(), name="m", namespace="ns")
        if m["kind"] == "PodDisruptionBudget"
    ]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "m"


def test_topology_spread_defaults_its_selector_to_the_resources_pods() -> None:
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        },
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {},
        },
    ]
    spec = {"model": "m", "topologySpreadConstraints": spread}
    pod = render(spec, ClusterFacts(), name="m", namespace="ns")[0]["spec"]["template"]["spec"]
    first, second = pod["topologySpreadConstraints"]
    assert first["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "m"
    assert second["labelSelector"] == {}


def test_otlp_traces_endpoint_from_the_spec_else_the_operators_default() -> None:
    collector = "http://collector.observability:4317"
    facts = ClusterFacts(otlp_traces_endpoint=collector)

    def traces_endpoint(spec: dict, facts: ClusterFacts) -> str | None:
        args = deployment(spec, facts)["spec"]["template"]["spec"]["containers"][0]["args"]
        return parse_serve_args(args).otlp_traces_endpoint

    assert traces_endpoint({"model": "x"}, FACTS) is None
    assert traces_endpoint({"model": "x"}, facts) == collector
    own = {"model": "x", "engine": {"otlpTracesEndpoint": "http://mine:4318"}}
    assert traces_endpoint(own, facts) == "http://mine:4318"
    assert traces_endpoint(own, FACTS) == "http://mine:4318"
