"""spec.lora: the adapters become the server's LoRA flags, which the server's own parser reads
back as the adapters (a hub id as is, cache:// under the cache volume's mount); the CRD types
and checks the list (the API server's verdicts are in e2e/test_operator_lora.py)."""

import pytest
from infernetes.operator.crd import build_crd
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render.workload import CACHE_MOUNT, container_args

from infernetes.schema.parser import parse_serve_args

SPEC = {
    "model": "org/base",
    "servedModelName": "base",
    "modelCache": {"claimName": "hf-cache"},
    "lora": {
        "maxRank": 32,
        "adapters": [
            {"name": "sql", "source": "acme/sql-lora"},
            {"name": "support", "source": "cache://adapters/support"},
        ],
    },
}


def _parsed(spec):
    return parse_serve_args(container_args(spec, ClusterFacts()))


def test_adapters_render_as_lora_flags_the_server_parses():
    config = _parsed(SPEC)
    assert config.enable_lora is True
    assert config.lora_modules == [
        {"name": "sql", "path": "acme/sql-lora"},
        {"name": "support", "path": f"{CACHE_MOUNT}/adapters/support"},
    ]
    assert config.max_loras == 2  # one step may mix every adapter
    assert config.max_lora_rank == 32


@pytest.mark.parametrize(
    ("engine", "max_loras"),
    [
        ({"maxLoras": 1}, 1),  # the engine's own setting wins
        ({"maxCpuLoras": 1}, 1),  # slots stay within the CPU cache (the server's rule)
        ({"enableLora": True}, 2),  # not rendered twice
    ],
)
def test_engine_lora_settings_are_kept(engine, max_loras):
    spec = {**SPEC, "engine": engine}
    args = container_args(spec, ClusterFacts())
    assert args.count("--enable-lora") == 1
    assert _parsed(spec).max_loras == max_loras


def test_no_adapters_no_flags():
    assert not any("lora" in a for a in container_args({"model": "org/base"}, ClusterFacts()))


def test_crd_types_spec_lora():
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    lora = spec["properties"]["lora"]
    adapters = lora["properties"]["adapters"]
    assert adapters["items"]["required"] == ["name", "source"]
    assert adapters["x-kubernetes-list-type"] == "map"
    assert lora["properties"]["maxRank"]["enum"][:3] == [1, 8, 16]
    messages = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert any("spec.lora or in spec.engine.loraModules" in m for m in messages)
    assert any("cache:// adapter source needs spec.modelCache" in m for m in messages)
