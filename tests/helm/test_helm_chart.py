"""The Helm chart: `helm lint`, `helm template` golden files, and the chart agreeing with the
operator it installs (RBAC rules, command line, default server image, CRDs).

Regenerate the golden files after an intended change with:
    INFERNETES_UPDATE_GOLDEN=1 .venv/bin/pytest tests/helm
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from infernetes.operator import names
from infernetes.operator.admission import engine_refusals, env_refusals
from infernetes.operator.crd import build_crd
from infernetes.operator.rbac import cluster_rules
from infernetes.operator.testing import refused_value

from infernetes import generate
from infernetes.cli.main import build_parser
from infernetes.schema.args import ARGS
from infernetes.schema.env import ENV_VARS

HERE = Path(__file__).parent
REPO_ROOT = HERE.parents[1]
CHART = REPO_ROOT / "helm" / "infernetes"
VALUES = sorted(p.stem for p in (HERE / "values").glob("*.yaml"))
RELEASE = ["infernetes", str(CHART), "--namespace", "infernetes-system"]


def helm(helm_bin: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def template(helm_bin: Path, *args: str) -> list[dict]:
    out = helm(helm_bin, "template", *RELEASE, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def operator_container(docs: list[dict]) -> dict:
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_strict(helm_bin: Path, values: str):
    result = helm(
        helm_bin, "lint", "--strict", str(CHART), "-f", str(HERE / "values" / f"{values}.yaml")
    )
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", VALUES)
def test_helm_template_matches_golden(helm_bin: Path, values: str):
    output = helm(
        helm_bin, "template", *RELEASE, "-f", str(HERE / "values" / f"{values}.yaml")
    ).stdout
    golden = HERE / "golden" / f"{values}.yaml"
    if os.environ.get("INFERNETES_UPDATE_GOLDEN") == "1":
        golden.write_text(output)
    assert golden.exists(), f"missing {golden}; run with INFERNETES_UPDATE_GOLDEN=1"
    assert output == golden.read_text(), (
        f"helm template with {values}.yaml changed; diff against {golden}"
    )


def test_every_values_file_has_a_golden_file():
    assert {p.stem for p in (HERE / "golden").glob("*.yaml")} == set(VALUES)


def test_cluster_role_is_the_operators_least_privilege_rbac(helm_bin: Path):
    docs = template(helm_bin)
    (role,) = find(docs, "ClusterRole")
    assert role["rules"] == cluster_rules()  # `infernetes operator rbac` is the source of truth
    (binding,) = find(docs, "ClusterRoleBinding")
    (service_account,) = find(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": service_account["metadata"]["name"],
            "namespace": "infernetes-system",
        }
    ]
    assert find(docs, "RoleBinding") == []


def test_watched_namespaces_get_role_bindings_and_namespaced_peering(helm_bin: Path):
    docs = template(helm_bin, "--set", "watchNamespaces={team-a,team-b}", "--set", "replicaCount=2")
    full_role = find(docs, "ClusterRole", "infernetes-operator")[0]["metadata"]["name"]
    bindings = find(docs, "RoleBinding")
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    assert all(
        b["roleRef"]
        == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": full_role}
        for b in bindings
    )
    # Cluster-wide, only reads of cluster-scoped objects remain.
    (cluster_binding,) = find(docs, "ClusterRoleBinding")
    (scope_role,) = find(docs, "ClusterRole", cluster_binding["roleRef"]["name"])
    assert {r for rule in scope_role["rules"] for r in rule["resources"]} == {
        "nodes",
        "namespaces",
        "customresourcedefinitions",
    }
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in scope_role["rules"])
    assert {p["metadata"]["namespace"] for p in find(docs, "KopfPeering")} == {"team-a", "team-b"}
    assert find(docs, "ClusterKopfPeering") == []
    args = operator_container(docs)["args"]
    assert (
        "--namespace=team-a" in args
        and "--namespace=team-b" in args
        and "--peering=infernetes" in args
    )


def test_operator_args_are_accepted_by_the_operator_cli(helm_bin: Path):
    for values in VALUES:
        args = operator_container(
            template(helm_bin, "-f", str(HERE / "values" / f"{values}.yaml"))
        )["args"]
        parsed = build_parser().parse_args(["operator", "run", *args])
        assert parsed.image and parsed.metrics_port == 8080 and parsed.health_port == 8081, values


def test_tracing_endpoint_reaches_the_operator_as_its_default(helm_bin: Path):
    assert not any(
        arg.startswith("--otlp-traces-endpoint")
        for arg in operator_container(template(helm_bin))["args"]
    )
    collector = "http://otel-collector.observability:4317"
    args = operator_container(template(helm_bin, "--set", f"tracing.otlpEndpoint={collector}"))[
        "args"
    ]
    assert build_parser().parse_args(["operator", "run", *args]).otlp_traces_endpoint == collector


def test_defaults_run_the_server_image_the_operator_defaults_to(helm_bin: Path):
    docs = template(helm_bin)
    container = operator_container(docs)
    assert f"--image={names.DEFAULT_IMAGE}" in container["args"]
    assert container["image"] == names.DEFAULT_IMAGE.replace(
        "/infernetes:", "/infernetes-operator:"
    )
    assert "--peering=infernetes" in container["args"]
    (peering,) = find(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "infernetes"


def test_standalone_when_peering_is_off_and_one_replica(helm_bin: Path):
    docs = template(helm_bin, "--set", "peering.enabled=false")
    assert "--standalone" in operator_container(docs)["args"]
    assert find(docs, "ClusterKopfPeering") == []
    # More than one replica needs peering whatever the flag says.
    docs = template(helm_bin, "--set", "peering.enabled=false", "--set", "replicaCount=3")
    assert "--peering=infernetes" in operator_container(docs)["args"]


def test_inference_services_from_values(helm_bin: Path):
    docs = template(helm_bin, "-f", str(HERE / "values" / "monitoring-and-services.yaml"))
    services = find(docs, names.KIND)
    assert [(s["metadata"]["name"], s["metadata"]["namespace"]) for s in services] == [
        ("qwen-cpu", "infernetes-system"),
        ("llama-8b", "models"),
    ]
    assert all(s["apiVersion"] == names.API_VERSION for s in services)
    assert services[1]["spec"] == {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3"},
        "engine": {"maxModelLen": "32k", "enablePrefixCaching": True},
    }
    (monitor,) = find(docs, "ServiceMonitor")
    (service,) = find(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    assert operator_container(docs)["image"].endswith("@sha256:" + "0123456789abcdef" * 4)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("logLevel=trace", "logLevel"),
        ("replicaCount=-1", "replicaCount"),
        ("replicas=2", "replicas"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("watchNamespaces[0]=Team_A", "watchNamespaces"),
        ("metrics.serviceMonitor.interval=often", "interval"),
    ],
)
def test_bad_values_are_rejected_with_the_field(helm_bin: Path, flag: str, message: str):
    result = helm(helm_bin, "template", *RELEASE, "--set", flag, check=False)
    assert result.returncode != 0
    assert (
        "values don't meet the specifications of the schema" in result.stderr
        and message in result.stderr
    )


def spec_values(tmp_path: Path, spec: dict) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump({"inferenceServices": [{"name": "isvc", "spec": {"model": "m", **spec}}]})
    )
    return str(path)


def test_inference_service_specs_meet_the_crd_schema(helm_bin: Path, tmp_path: Path):
    bad = {
        "replicas": -1,
        "gpu": {"vendor": "intel"},
        "engine": {"maxModelLength": 5, "dtype": "float128"},
    }
    result = helm(
        helm_bin, "lint", "--strict", str(CHART), "-f", spec_values(tmp_path, bad), check=False
    )
    assert result.returncode != 0
    for path in ("spec/replicas", "spec/gpu/vendor", "spec/engine/dtype"):
        assert f"/inferenceServices/0/{path}'" in result.stdout + result.stderr, path
    assert "'maxModelLength' not allowed" in result.stdout + result.stderr


def test_every_setting_the_runtime_refuses_fails_helm_template(helm_bin: Path, tmp_path: Path):
    crd_spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec: dict = {"engine": {}, "engineEnv": {}}
    refusals = [("engine", item) for item in engine_refusals(ARGS)]
    refusals += [("engineEnv", item) for item in env_refusals(ENV_VARS)]
    for section, item in refusals:
        field = crd_spec["properties"][section]["properties"][item.field]
        spec[section][item.field] = refused_value(field, item)
    result = helm(helm_bin, "template", *RELEASE, "-f", spec_values(tmp_path, spec), check=False)
    assert result.returncode != 0
    for section, item in refusals:
        assert f"/inferenceServices/0/spec/{section}/{item.field}'" in result.stderr, item.field


def test_settings_without_effect_and_allowed_values_pass(helm_bin: Path, tmp_path: Path):
    spec = {
        "engine": {
            "swapSpace": 8,
            "tensorParallelSize": 1,
            "enableLora": False,
            "quantization": "fp8",
        },
        "engineEnv": {"VLLM_NO_USAGE_STATS": True, "VLLM_USE_V1": True},
    }
    docs = template(helm_bin, "-f", spec_values(tmp_path, spec))
    (service,) = find(docs, names.KIND)
    assert service["spec"] == {"model": "m", **spec}


def test_values_schema_is_generated_from_the_crd():
    target = "helm/infernetes/values.schema.json"
    assert (CHART / "values.schema.json").read_text() == generate.render(target), (
        f"{target} is stale: make generate"
    )


def test_service_monitor_without_its_service_fails_with_a_reason(helm_bin: Path):
    result = helm(
        helm_bin,
        "template",
        *RELEASE,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.service.enabled=false",
        check=False,
    )
    assert result.returncode != 0 and "needs metrics.service.enabled" in result.stderr


def test_chart_crds_are_generated_from_the_schema():
    chart_crds = {p.name for p in (CHART / "crds").glob("*.yaml")}
    assert chart_crds == {p.name for p in (REPO_ROOT / "crds").glob("*.yaml")}
    for name in chart_crds:
        target = f"helm/infernetes/crds/{name}"
        assert generate.GENERATORS[target] == generate.GENERATORS[f"crds/{name}"]
        assert (CHART / "crds" / name).read_text() == generate.render(target), (
            f"{target} is stale: make generate"
        )


def test_chart_version_follows_the_package():
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    assert names.DEFAULT_IMAGE.endswith(f":{version}")


def test_each_release_gets_its_own_peering(helm_bin: Path):
    out = helm(helm_bin, "template", "team-a", str(CHART), "--namespace", "ops").stdout
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    (peering,) = find(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "team-a-infernetes"
    assert "--peering=team-a-infernetes" in operator_container(docs)["args"]
