"""Golden tests of `infernetes operator render`: each sample's output is checked in under golden/.

Regenerate after an intended change with:
    INFERNETES_UPDATE_GOLDEN=1 .venv/bin/pytest tests/operator/test_operator_render_golden.py
"""

import contextlib
import io
import os
from pathlib import Path

import pytest

from infernetes.cli.main import main

HERE = Path(__file__).parent
SAMPLES = HERE / "samples"
GOLDEN = HERE / "golden"

# sample -> extra `operator render` arguments (the cluster facts the sample is rendered for)
CASES = {
    "cpu": [],
    "gpu-1": ["--spare-gpus", "nvidia.com/gpu=0"],
    "tp4": ["--spare-gpus", "nvidia.com/gpu=8"],
    "tp2-pp2": [],
    "servicemonitor": ["--api-versions", "monitoring.coreos.com/v1"],
    "podmonitor": ["--api-versions", "monitoring.coreos.com/v1/PodMonitor"],
    "vllm-name": [],
    "recreate": [],
    "model-cache": [],
    "hf-token": [],
    "security": [],
    "lora": [],
    "autoscaling-keda": ["--api-versions", "keda.sh/v1alpha1"],
    "autoscaling-hpa": [],
    "multinode-tp16": ["--api-versions", "leaderworkerset.x-k8s.io/v1"],
    "kv-offload": [],
    "prefill-decode": ["--api-versions", "inference.networking.k8s.io/v1"],
    "routing-gateway": [
        "--api-versions",
        "inference.networking.k8s.io/v1,gateway.networking.k8s.io/v1",
    ],
}


def render(sample: str, extra: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["operator", "render", "-f", str(SAMPLES / f"{sample}.yaml"), *extra])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("sample", sorted(CASES))
def test_render_matches_golden(sample: str) -> None:
    code, output, _ = render(sample, CASES[sample])
    assert code == 0
    golden = GOLDEN / f"{sample}.yaml"
    if os.environ.get("INFERNETES_UPDATE_GOLDEN") == "1":
        golden.write_text(output)
    assert golden.exists(), f"missing {golden}; run with INFERNETES_UPDATE_GOLDEN=1"
    assert output == golden.read_text(), f"render of {sample} changed; diff against {golden}"


def test_every_sample_has_a_case() -> None:
    assert {p.stem for p in SAMPLES.glob("*.yaml")} == set(CASES)


def test_vllm_name_warns_on_stderr() -> None:
    _, _, err = render("vllm-name", [])
    assert "infsvc-vllm" in err and "VLLM_PORT" in err
