"""`infernetes operator crd|rbac|render`: output and errors (exit 2 naming the problem)."""

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from infernetes.operator.crd import build_crd

from infernetes.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_crd_prints_the_checked_in_file() -> None:
    code, out, _ = run("operator", "crd")
    assert code == 0
    assert out == (ROOT / "crds/inferenceservices.infernetes.io.yaml").read_text()
    assert yaml.safe_load(out) == build_crd()
    code, out, _ = run("operator", "crd", "--with-peering")
    assert [doc["metadata"]["name"] for doc in yaml.safe_load_all(out)][1:] == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ]


def test_rbac_is_least_privilege() -> None:
    code, out, _ = run("operator", "rbac", "--namespace", "ops")
    assert code == 0
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(out)}
    rules = docs["ClusterRole"]["rules"]
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in rules)
    pods = next(r for r in rules if "pods" in r["resources"])
    assert pods["verbs"] == ["get", "list", "watch"]
    assert not any("secrets" in r["resources"] for r in rules)
    assert docs["ClusterRoleBinding"]["subjects"][0]["namespace"] == "ops"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "isvc.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Deployment\napiVersion: apps/v1\n", "expected kind InferenceService"),
        (
            "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\nspec: {}\n",
            "spec.model",
        ),
        (
            "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\n"
            "spec: {model: m, engine: {maxModelLength: 4}}\n",
            "spec.engine.maxModelLength: field not declared in schema (did you mean maxModelLen?)",
        ),
        (
            "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\n"
            "spec: {model: m, replicsa: 3, gpu: {claims: 2}, env: [{name: A, vaule: b}]}\n",
            "spec.replicsa: field not declared in schema (did you mean replicas?); "
            "spec.gpu.claims: field not declared in schema; "
            "spec.env[0].vaule: field not declared in schema (did you mean value?)",
        ),
        ("{: bad yaml", "not valid YAML"),
    ],
)
def test_render_errors_exit_2(tmp_path: Path, text: str, message: str) -> None:
    code, _, err = run("operator", "render", "-f", write(tmp_path, text))
    assert code == 2
    assert message in err


def test_render_bad_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\nspec: {model: m}\n",
    )
    code, _, err = run("operator", "render", "-f", path, "--api-versions", "nonsense")
    assert code == 2 and "group/version" in err
    code, _, err = run("operator", "render", "-f", path, "--spare-gpus", "8")
    assert code == 2 and "RESOURCE=N" in err
    code, _, err = run("operator", "render", "-f", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err


def test_render_uses_namespace_flag(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\nspec: {model: m}\n",
    )
    code, out, _ = run("operator", "render", "-f", path, "-n", "team")
    assert code == 0
    assert {doc["metadata"]["namespace"] for doc in yaml.safe_load_all(out)} == {"team"}


def test_help_does_not_import_heavy_modules() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from infernetes.cli.main import main\n"
        "try:\n    main(['operator', 'render', '--help'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in ('kopf', 'kubernetes', 'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_render_warns_when_scale_to_zero_needs_keda(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\n"
        "spec: {model: m, autoscaling: {minReplicas: 0, maxReplicas: 2, targetQueuedRequests: 1,"
        " keda: {prometheusServerAddress: 'http://p:9090'}}}\n",
    )
    code, out, err = run("operator", "render", "-f", path)
    assert code == 0 and "ScaleToZeroNeedsKEDA" in err
    assert "ScaledObject" not in out and "HorizontalPodAutoscaler" not in out
    code, out, err = run("operator", "render", "-f", path, "--api-versions", "keda.sh/v1alpha1")
    # Rendered, but nothing records demand at zero replicas without the endpoint picker.
    assert code == 0 and "NothingActivatesFromZero" in err
    assert [doc["kind"] for doc in yaml.safe_load_all(out)][-1] == "ScaledObject"
