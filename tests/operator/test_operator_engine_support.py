"""What the runtime will make of spec.engine/engineEnv, field by field: plan() and
`infernetes operator render` report settings without effect (and refused ones the CRD stops)."""

import contextlib
import io
from pathlib import Path

from infernetes.operator.engine_support import review_engine
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import plan

from infernetes.cli.main import main

QUIET = {
    "model": "m",
    "engine": {"device": "cpu", "maxModelLen": "8k", "enablePrefixCaching": True},
}
NOISY = {
    "model": "m",
    "engine": {"device": "cpu", "swapSpace": 8, "schedulerDelayFactor": 0.5, "enableLora": False},
    "engineEnv": {"VLLM_NO_USAGE_STATS": True},
}


def test_honoured_settings_leave_no_notes() -> None:
    notes = review_engine(QUIET)
    assert notes.ignored == [] and notes.refused == []


def test_each_setting_without_effect_is_named_by_its_field_and_why() -> None:
    ignored = review_engine(NOISY).ignored
    assert [note.split(":")[0] for note in ignored] == [
        "spec.engine.swapSpace",
        "spec.engine.schedulerDelayFactor",
        "spec.engineEnv.VLLM_NO_USAGE_STATS",
    ]
    assert "--swap-space 8.0 has no effect here: preempted requests are recomputed" in ignored[0]
    assert "VLLM_NO_USAGE_STATS=1 has no effect here" in ignored[2]


def test_defaults_written_out_are_not_notes() -> None:
    notes = review_engine(
        {"engine": {"swapSpace": 4, "enableLora": False, "tensorParallelSize": 1}}
    )
    assert notes.ignored == [] and notes.refused == []


def test_refused_settings_are_notes_of_their_own() -> None:
    notes = review_engine(
        {"engine": {"ptLoadMapLocation": "cuda"}, "engineEnv": {"VLLM_USE_V1": False}}
    )
    assert notes.ignored == []
    assert notes.refused[0].startswith(
        "spec.engine.ptLoadMapLocation: argument --pt-load-map-location cuda is not"
    )
    assert notes.refused[1].startswith("spec.engineEnv.VLLM_USE_V1: VLLM_USE_V1=0 is not supported")


def test_values_the_crd_would_refuse_are_left_to_it() -> None:
    assert review_engine({"engine": {"swapSpace": "lots"}}).ignored == []


def test_plan_warns_of_settings_without_effect() -> None:
    result = plan(NOISY, ClusterFacts(), name="m", namespace="ns")
    assert result.ignored == review_engine(NOISY).ignored
    assert result.warnings[-len(result.ignored) :] == result.ignored
    assert plan(QUIET, ClusterFacts(), name="m", namespace="ns").warnings == []


def test_render_prints_them_on_stderr(tmp_path: Path) -> None:
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(
        "apiVersion: infernetes.io/v1alpha1\nkind: InferenceService\nmetadata: {name: noisy}\n"
        "spec: {model: m, engine: {device: cpu, swapSpace: 8, ptLoadMapLocation: cuda}}\n"
    )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["operator", "render", "-f", str(manifest)]) == 0
    lines = err.getvalue().splitlines()
    assert lines[0].startswith(
        "warning: noisy: spec.engine.swapSpace: argument --swap-space 8.0 has no effect"
    )
    assert lines[1].startswith(
        "warning: noisy: spec.engine.ptLoadMapLocation: argument --pt-load-map-location"
    )
    assert lines[1].endswith("kubectl apply will reject it")
    assert "kind: Deployment" in out.getvalue()
