"""Admission refuses what the runtime refuses: the support table narrowed onto the CRD's fields
(the e2e tests check the real API server evaluates every rule)."""

from typing import Any

import pytest
from infernetes.operator.admission import (
    Refusal,
    engine_refusals,
    env_refusals,
    narrow_with_cel,
    narrow_with_enums,
    refusal,
)
from infernetes.operator.crd import build_crd
from infernetes.operator.engine_schema import camel, engine_args, engine_env_vars

from infernetes.schema.args import ARGS
from infernetes.schema.env import ENV_VARS
from infernetes.schema.support import ARG_SUPPORT, ENV_SUPPORT, no_effect, partial, refused


def spec() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def refuses(support: Any) -> bool:
    return support.kind == "refused" or (support.kind == "partial" and support.others == "refused")


def test_every_refused_engine_field_and_no_other_is_narrowed() -> None:
    narrowed = {item.field for item in engine_refusals(ARGS)}
    expected = {camel(arg.dest) for arg in engine_args(ARGS) if refuses(ARG_SUPPORT[arg.dest])}
    assert narrowed == expected
    assert {
        "ptLoadMapLocation",
        "fullyShardedLoras",
        "longLoraScalingFactors",
        "quantization",
    } <= narrowed
    # No effect, or honoured (request traces since the runtime exports them).
    honoured = {"otlpTracesEndpoint", "collectDetailedTraces", "attentionBackend", "maxModelLen"}
    assert not narrowed & {"swapSpace", "apiServerCount", *honoured}


def test_every_refused_variable_and_no_other_is_narrowed() -> None:
    narrowed = {item.field for item in env_refusals(ENV_VARS)}
    expected = {var.name for var in engine_env_vars(ENV_VARS) if refuses(ENV_SUPPORT[var.name])}
    assert narrowed == expected
    assert "VLLM_USE_MODELSCOPE" in narrowed and "VLLM_ATTENTION_BACKEND" not in narrowed


@pytest.mark.parametrize(
    ("kind", "default", "support", "allowed"),
    [
        ("bool", None, refused("r"), (False,)),  # unset and false both mean off
        ("bool", False, refused("r"), (False,)),
        ("str", None, refused("r"), ()),
        ("json", {}, refused("r"), ()),
        ("str", "auto", refused("r"), ("auto",)),
        ("float", 0, refused("r"), (0.0,)),
        ("int", 1, partial((1,), "r"), (1,)),
        ("str", None, partial(("fp8",), "r"), ("fp8",)),
        ("str", "auto", partial(("hf",), "r"), ("hf", "auto")),
    ],
)
def test_allowed_values_are_the_supported_ones_and_the_default(
    kind: str, default: Any, support: Any, allowed: tuple
) -> None:
    item = refusal("field", "--flag", kind, default, support)
    assert item is not None and item.allowed == allowed


def test_settings_without_effect_or_with_a_fallback_are_not_refused() -> None:
    assert refusal("f", "--f", "bool", False, no_effect("r")) is None
    assert refusal("f", "--f", "str", "auto", partial(("auto",), "r", others="no_effect")) is None


def test_messages_name_the_flag_the_reason_and_what_is_accepted() -> None:
    by_field = {item.field: item for item in engine_refusals(ARGS)}
    location = by_field["ptLoadMapLocation"].message
    assert location.startswith(
        "--pt-load-map-location is not supported with this value: weights load to the CPU"
    )
    assert location.endswith("supported: cpu")
    assert by_field["fullyShardedLoras"].message.endswith("only false is accepted")
    assert by_field["longLoraScalingFactors"].message.endswith("leave it unset")
    assert by_field["ubatchSize"].message.endswith("only 0 is accepted")


def test_the_crd_checks_allowed_values_on_the_field_and_unset_ones_on_the_object() -> None:
    engine = spec()["properties"]["engine"]
    location = engine["properties"]["ptLoadMapLocation"]
    assert location["x-kubernetes-validations"][-1]["rule"] == "self == 'cpu'"
    assert location["description"].startswith(
        "--pt-load-map-location is not supported with this value"
    )
    parser = engine["properties"]["reasoningParser"]["x-kubernetes-validations"][-1]["rule"]
    built = ARG_SUPPORT["reasoning_parser"].values
    assert parser == "self in [" + ", ".join(f"'{name}'" for name in built) + "]"
    assert "'qwen3'" in parser and "'step3p5'" not in parser  # not built
    (unset,) = [
        r
        for r in engine["x-kubernetes-validations"]
        if r.get("reason") == "FieldValueForbidden"
        and r.get("fieldPath") == ".longLoraScalingFactors"
    ]
    assert (
        unset["rule"] == "!has(self.longLoraScalingFactors)"
        and unset["reason"] == "FieldValueForbidden"
    )
    env = spec()["properties"]["engineEnv"]["properties"]
    assert env["VLLM_USE_V1"]["x-kubernetes-validations"][-1]["rule"] == "self == true"


def test_cel_strings_are_quoted() -> None:
    schema = {"type": "object", "properties": {"f": {"type": "string"}}}
    narrow_with_cel(schema, [Refusal("f", ("it's", "a\\b"), "m")])
    assert (
        schema["properties"]["f"]["x-kubernetes-validations"][0]["rule"]
        == "self in ['it\\'s', 'a\\\\b']"
    )
    assert "x-kubernetes-validations" not in schema


def test_json_schema_form_is_an_enum_or_nothing_at_all() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "enum": [1, 2]}, "b": {"type": "string"}},
    }
    narrow_with_enums(schema, [Refusal("a", (1,), "m"), Refusal("b", (), "m")])
    assert schema["properties"]["a"]["enum"] == [1]
    assert schema["properties"]["b"]["not"] == {}
