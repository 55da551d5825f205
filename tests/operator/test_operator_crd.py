"""The CRD: generated from the schema, structural, checked in, and with the rules it promises."""

import re
from pathlib import Path
from typing import Any

import yaml
from infernetes.operator.admission import engine_refusals
from infernetes.operator.crd import build_crd, crd_yaml
from infernetes.operator.engine_schema import ENGINE_RULES, camel, engine_args
from infernetes.operator.generated import peering_yaml

from infernetes.schema.args import ARGS
from infernetes.schema.env import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]


def version() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]


def spec_schema() -> dict[str, Any]:
    return version()["schema"]["openAPIV3Schema"]["properties"]["spec"]


def walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def test_checked_in_files_are_current() -> None:
    assert (ROOT / "crds/inferenceservices.infernetes.io.yaml").read_text() == crd_yaml(), (
        "run make generate"
    )
    assert (ROOT / "crds/kopf-peerings.kopf.dev.yaml").read_text() == peering_yaml(), (
        "run make generate"
    )


def test_schema_is_structural() -> None:
    for path, node in walk(version()["schema"]["openAPIV3Schema"]):
        typed = (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        )
        assert typed, f"{path} has no type"
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path


def test_names_subresources_and_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "inferenceservices.infernetes.io"
    assert crd["spec"]["names"]["shortNames"] == ["infsvc"]
    v = version()
    assert v["name"] == "v1alpha1"
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert v["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    assert "status" in v["subresources"]
    columns = [c["name"] for c in v["additionalPrinterColumns"]]
    assert columns == ["Model", "Ready", "Replicas", "Available", "GPUs", "URL", "Age"]


def test_every_current_argument_is_an_engine_field_except_owned_and_secret() -> None:
    engine = spec_schema()["properties"]["engine"]["properties"]
    expected = {camel(arg.dest) for arg in engine_args(ARGS)}
    assert set(engine) == expected
    for arg in ARGS:
        field = camel(arg.dest)
        if arg.operator_owned or arg.secret or not arg.stored:  # shorthands go in by their keys
            assert field not in engine, field
    for field in ("host", "port", "uds", "model", "apiKey", "hfToken", "servedModelName"):
        assert field not in engine
    assert {
        "tensorParallelSize",
        "maxModelLen",
        "gpuMemoryUtilization",
        "speculativeConfig",
    } <= set(engine)


def test_engine_field_types_follow_the_schema() -> None:
    engine = spec_schema()["properties"]["engine"]["properties"]
    assert engine["gpuMemoryUtilization"]["type"] == "number"
    assert engine["gpuMemoryUtilization"]["exclusiveMinimum"] is True
    assert engine["gpuMemoryUtilization"]["maximum"] == 1
    assert engine["tensorParallelSize"]["minimum"] == 1
    assert engine["maxModelLen"]["x-kubernetes-int-or-string"] is True
    assert re.match(engine["maxModelLen"]["pattern"], "25.6k") and re.match(
        engine["maxModelLen"]["pattern"], "auto"
    )
    assert "llama3_json" in engine["toolCallParser"]["enum"]
    assert engine["enforceEager"]["type"] == "boolean"
    assert engine["loraModules"]["type"] == "array"
    assert engine["loraModules"]["items"]["required"] == ["name", "path"]
    assert engine["speculativeConfig"].get("x-kubernetes-preserve-unknown-fields") is True
    assert engine["allowedOrigins"]["type"] == "array"


def test_engine_env_is_typed_and_keeps_operator_variables_out() -> None:
    env = spec_schema()["properties"]["engineEnv"]["properties"]
    assert all(name.startswith("VLLM_") for name in env)
    for owned in ("VLLM_PORT", "VLLM_HOST_IP", "VLLM_API_KEY", "VLLM_TARGET_DEVICE"):
        assert owned not in env
    runtime_vars = [
        v for v in ENV_VARS if v.name.startswith("VLLM_") and not v.build_time and not v.secret
    ]
    assert len(env) == len(runtime_vars) - 2  # VLLM_PORT and VLLM_HOST_IP
    assert env["VLLM_ATTENTION_BACKEND"]["enum"]


def test_cel_rules_reference_existing_fields() -> None:
    engine = spec_schema()["properties"]["engine"]
    for fields, rule in ENGINE_RULES:
        assert set(fields) <= set(engine["properties"]), fields
        for name in re.findall(r"self\.([a-zA-Z]+)", rule["rule"]):
            assert name in fields, (name, rule["rule"])
    unset_only = [item for item in engine_refusals(ARGS) if not item.allowed]
    assert len(engine["x-kubernetes-validations"]) == len(ENGINE_RULES) + len(unset_only)
    spec_rules = [r["rule"] for r in spec_schema()["x-kubernetes-validations"]]
    assert any("tensorParallelSize" in r for r in spec_rules)


def test_shutdown_timeout_must_end_before_the_grace_period() -> None:
    schema = spec_schema()
    (drain,) = [
        r
        for r in schema["x-kubernetes-validations"]
        if r.get("fieldPath") == ".engine.shutdownTimeout"
    ]
    assert (
        "self.engine.shutdownTimeout + " in drain["rule"]
        and "self.terminationGracePeriodSeconds" in drain["rule"]
    )
    assert "terminationGracePeriodSeconds" in drain["message"]
    assert schema["properties"]["terminationGracePeriodSeconds"]["default"] == 60
    assert schema["properties"]["engine"]["properties"]["shutdownTimeout"]["minimum"] == 0


def test_strings_in_rules_are_bounded() -> None:
    # CEL's cost estimate needs a maxLength on strings the rules read.
    props = spec_schema()["properties"]
    assert props["model"]["maxLength"] == 512
    assert props["env"]["maxItems"] and props["env"]["items"]["properties"]["name"]["maxLength"]
    assert props["envFrom"]["items"]["properties"]["prefix"]["maxLength"]


def test_yaml_round_trips() -> None:
    assert yaml.safe_load(crd_yaml()) == build_crd()
