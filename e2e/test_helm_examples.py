"""Every sample in examples/ is accepted by the API server (real CRD schema and CEL admission),
and a sample broken in one field is rejected with that field's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import install_crds
from localcluster import KubectlError

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


@pytest.fixture(scope="module", autouse=True)
def crds(cluster: Any) -> None:
    install_crds(cluster.kubectl)


def test_there_are_examples_for_each_documented_use():
    assert {p.stem for p in EXAMPLES} == {
        "cpu-tiny",
        "gpu-single",
        "monitoring-servicemonitor",
        "hf-token-secret",
        "model-cache-pvc",
        "tensor-parallel",
        "autoscaling",
        "multinode",
        "routing",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_accepted(cluster: Any, namespace: str, example: Path):
    documents = [doc for doc in yaml.safe_load_all(example.read_text()) if doc]
    cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    for doc in documents:
        stored = cluster.kubectl_json("get", doc["kind"], doc["metadata"]["name"], "-n", namespace)
        assert (
            stored["spec"]["model" if doc["kind"] == "InferenceService" else "resources"]
            == doc["spec"]["model" if doc["kind"] == "InferenceService" else "resources"]
        )


def test_a_broken_example_is_rejected_with_the_field(cluster: Any, namespace: str):
    sample = yaml.safe_load((EXAMPLES[0].parent / "gpu-single.yaml").read_text())
    sample["spec"]["engine"]["tensorParallelSize"] = 0
    with pytest.raises(KubectlError) as rejected:
        cluster.apply(sample, namespace=namespace)
    assert "spec.engine.tensorParallelSize" in str(rejected.value)
