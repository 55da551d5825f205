"""parse(render(spec)) == spec: the argv and env the operator renders mean exactly the spec.

Checked through the schema's own parser (`parse_serve_args`, `read_env`) and, for the CPU
sample, through the `infernetes config` command a user would run.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from infernetes.operator.argv import EngineSpecError, engine_argv, engine_env
from infernetes.operator.engine_schema import camel, engine_args, engine_env_vars
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render.workload import container_args

from infernetes.schema.args import ARGS
from infernetes.schema.env import ENV_VARS, read_env
from infernetes.schema.frozen import thaw
from infernetes.schema.parser import parse_serve_args
from infernetes.schema.values import CONVERTERS

SAMPLES = Path(__file__).parent / "samples"
# Fields the runtime only accepts together with another one (infernetes.schema.rules).
COMPANIONS: dict[str, dict[str, Any]] = {
    "enableAutoToolChoice": {"toolCallParser": "hermes"},
    "loraModules": {"enableLora": True},
    "promptAdapters": {"enablePromptAdapter": True},
    "collectDetailedTraces": {"otlpTracesEndpoint": "http://collector:4317"},
    "maxLongPartialPrefills": {"maxNumPartialPrefills": 4},
    "dataParallelSizeLocal": {"dataParallelSize": 4},
}


def sample_value(arg: Any) -> Any:
    """A valid, non-default value of the argument's type, as a user would write it in YAML."""
    if arg.kind == "bool":
        return not bool(arg.default)
    if arg.choices:
        choices = [c for c in arg.choices if c != arg.default]
        value = choices[-1]
    elif arg.kind == "int":
        low = int(arg.minimum) if arg.minimum is not None else 0
        value = min(low + 2, int(arg.maximum)) if arg.maximum is not None else low + 2
    elif arg.kind == "float":
        value = 0.5 if arg.maximum is not None and arg.maximum <= 1 else 2.5
    elif arg.kind == "size":
        value = "2k"
    elif arg.dest == "structured_outputs_config":  # its keys are checked
        value = {"backend": "guidance", "disable_any_whitespace": True}
    elif arg.kind == "json":
        value = ["x", "y"] if isinstance(arg.default, list) else {"key": 1, "nested": {"a": [1, 2]}}
    elif arg.kind == "name_path":
        value = {"name": "a", "path": "/adapters/a"}
    else:
        value = "some-value"
    if not arg.is_list:
        return value
    if arg.kind == "name_path":
        return [value, {"name": "b", "path": "/b", "base_model_name": "base"}]
    return [value, value]


def expected(arg: Any, value: Any) -> Any:
    convert = CONVERTERS[arg.kind]
    return [convert(item) for item in value] if arg.is_list else convert(value)


def parsed(argv: list[str]) -> Any:
    return parse_serve_args(["--model=/models/m", *argv])


@pytest.mark.parametrize("arg", engine_args(ARGS), ids=lambda arg: camel(arg.dest))
def test_every_engine_field_round_trips(arg: Any) -> None:
    field = camel(arg.dest)
    value = sample_value(arg)
    engine = {field: value, **COMPANIONS.get(field, {})}
    config = parsed(engine_argv(engine))
    actual = thaw(getattr(config, arg.dest))
    assert actual == expected(arg, value)


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_samples_round_trip(path: Path) -> None:
    by_field = {camel(arg.dest): arg for arg in engine_args(ARGS)}
    for doc in yaml.safe_load_all(path.read_text()):
        spec = doc["spec"]
        config = parse_serve_args(container_args(spec, ClusterFacts()))
        for field, value in (spec.get("engine") or {}).items():
            arg = by_field[field]
            assert thaw(getattr(config, arg.dest)) == expected(arg, value), field
        assert config.host == "0.0.0.0" and config.port == 8000


def test_unknown_engine_field_is_named() -> None:
    with pytest.raises(EngineSpecError, match="maxModelLength"):
        engine_argv({"maxModelLength": 5})
    with pytest.raises(EngineSpecError, match="VLLM_PORT"):
        engine_env({"VLLM_PORT": 5})


def test_negative_values_are_not_read_as_flags() -> None:
    assert parsed(engine_argv({"seed": -1})).seed == -1


@pytest.mark.parametrize("var", engine_env_vars(ENV_VARS), ids=lambda var: var.name)
def test_engine_env_round_trips(var: Any) -> None:
    if var.kind == "bool":
        value: Any = not bool(var.default)
    elif var.choices:
        value = [var.choices[-1]] if var.kind == "list" else var.choices[-1]
    elif var.kind == "int":
        value = 7
    elif var.kind == "float":
        value = 2.5
    elif var.kind == "list":
        value = ["a", "b"]
    else:
        value = "/some/where" if var.kind == "path" else "some-value"
    rendered = {item["name"]: item["value"] for item in engine_env({var.name: value})}
    result = read_env(var.name, rendered)
    assert (list(result) if var.kind == "list" else result) == value


def test_cpu_sample_through_infernetes_config() -> None:
    spec = yaml.safe_load((SAMPLES / "cpu.yaml").read_text())["spec"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "infernetes.cli.main",
            "config",
            *container_args(spec, ClusterFacts()),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    flat = {
        key: value for group in json.loads(result.stdout).values() for key, value in group.items()
    }
    assert flat["device"] == "cpu"
    assert flat["max_model_len"] == 512
    assert flat["max_num_seqs"] == 4
    assert flat["enforce_eager"] is True
    assert flat["served_model_name"] == ["tiny"]
    assert flat["port"] == 8000
