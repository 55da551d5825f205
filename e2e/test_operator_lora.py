"""spec.lora on the local control plane: an InferenceService with two adapters gets a Deployment
whose server argv carries the LoRA flags, a changed adapter list rolls it, `kubectl explain`
documents the field, and bad adapter entries are refused at admission with the field path."""

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from infernetes.operator.testing import (
    OperatorProcess,
    running_operator,
    temporary_namespace,
    wait_until,
)

TIMEOUT = 90
ADAPTERS = [
    {"name": "sql", "source": "acme/llama-sql-lora"},
    {"name": "support", "source": "cache://adapters/support"},
]


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-lora") as name:
        yield name


@pytest.fixture(scope="module")
def operator(
    cluster: Any, ns: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator-lora")) as process:
        yield process


def isvc(name: str, **spec: Any) -> dict:
    return {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "modelCache": {"claimName": "hf-cache"},
            **spec,
        },
    }


def server_args(cluster: Any, ns: str, name: str) -> list[str] | None:
    result = cluster.kubectl("get", "deployment", name, "-n", ns, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    deployment = yaml.safe_load(result.stdout)
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_two_adapters_render_the_flags_and_a_new_list_rolls(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    cluster.apply(isvc("adapters", lora={"adapters": ADAPTERS, "maxRank": 64}), namespace=ns)
    args = wait_until(
        lambda: server_args(cluster, ns, "adapters"), timeout=TIMEOUT, what="the Deployment"
    )
    start = args.index("--lora-modules")
    assert "--enable-lora" in args
    assert args[start + 1 : start + 3] == [
        "sql=acme/llama-sql-lora",
        "support=/var/cache/huggingface/adapters/support",
    ]
    assert "--max-loras=2" in args and "--max-lora-rank=64" in args

    changed = {"adapters": [*ADAPTERS, {"name": "chat", "source": "acme/chat-lora"}]}
    cluster.apply(isvc("adapters", lora=changed), namespace=ns)
    rolled = wait_until(
        lambda: (a := server_args(cluster, ns, "adapters")) and "chat=acme/chat-lora" in a and a,
        timeout=TIMEOUT,
        what="the Deployment with the new adapter",
    )
    assert "--max-loras=3" in rolled


def test_kubectl_explain_documents_spec_lora(cluster: Any, operator: OperatorProcess) -> None:
    explained = cluster.kubectl("explain", "infsvc.spec.lora", "--recursive").stdout
    assert "adapters" in explained and "source" in explained and "maxRank" in explained
    source = cluster.kubectl("explain", "infsvc.spec.lora.adapters.source").stdout
    assert "Hugging Face id" in source and "cache://" in source


@pytest.mark.parametrize(
    ("case", "spec", "expected"),
    [
        (
            "bad-source",
            {"lora": {"adapters": [{"name": "a", "source": "/not/a/source"}]}},
            "spec.lora.adapters[0].source",
        ),
        (
            "bad-name",
            {"lora": {"adapters": [{"name": "a=b", "source": "org/x"}]}},
            "spec.lora.adapters[0].name",
        ),
        (
            "no-source",
            {"lora": {"adapters": [{"name": "a"}]}},
            "spec.lora.adapters[0].source: Required value",
        ),
        (
            "duplicate-name",
            {
                "lora": {
                    "adapters": [{"name": "a", "source": "o/x"}, {"name": "a", "source": "o/y"}]
                }
            },
            "spec.lora.adapters[1]: Duplicate value",
        ),
        (
            "rank-not-a-choice",
            {"lora": {"adapters": ADAPTERS, "maxRank": 12}},
            "spec.lora.maxRank",
        ),
        (
            "both-lists",
            {
                "lora": {"adapters": ADAPTERS},
                "engine": {"enableLora": True, "loraModules": [{"name": "b", "path": "/b"}]},
            },
            "spec.lora or in spec.engine.loraModules",
        ),
        (
            "lora-turned-off",
            {"lora": {"adapters": ADAPTERS}, "engine": {"enableLora": False}},
            "engine.enableLora must not be false",
        ),
    ],
)
def test_bad_adapter_entries_are_refused(
    cluster: Any, ns: str, operator: OperatorProcess, case: str, spec: dict, expected: str
) -> None:
    resource = isvc(f"bad-{case}", **spec)
    result = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        ns,
        "-f",
        "-",
        input=yaml.safe_dump(resource),
        check=False,
    )
    assert result.returncode != 0, f"accepted {case}"
    assert expected in result.stderr, result.stderr


def test_cache_source_needs_the_model_cache(
    cluster: Any, ns: str, operator: OperatorProcess
) -> None:
    resource = isvc("no-cache", lora={"adapters": ADAPTERS})
    del resource["spec"]["modelCache"]
    result = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        ns,
        "-f",
        "-",
        input=yaml.safe_dump(resource),
        check=False,
    )
    assert result.returncode != 0
    assert "cache:// adapter source needs spec.modelCache" in result.stderr, result.stderr
