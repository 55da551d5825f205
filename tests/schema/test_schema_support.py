"""The support table: every argument and variable has an entry; refused values exit 2 naming the
flag, no-effect ones warn naming it, and every honoured argument is exercised by a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infernetes.schema.args import CURRENT_ARGS, Arg
from infernetes.schema.config import build_config
from infernetes.schema.env import ENV_VARS, EnvVar
from infernetes.schema.support import ARG_SUPPORT, ENV_SUPPORT
from infernetes.schema.support_check import check_support, report_support

REPO = Path(__file__).resolve().parents[2]


def _non_default(arg: Arg, avoid: tuple = ()) -> object:
    """A valid value other than the default (and other than ``avoid``)."""
    if arg.choices:
        return next(c for c in arg.choices if c != arg.default and c not in avoid)
    if arg.kind == "bool":
        return not arg.default
    if arg.kind in ("int", "size", "float"):
        base = arg.default if isinstance(arg.default, int | float) else (arg.minimum or 0)
        value = base + 2
        if arg.maximum is None or value <= arg.maximum:
            return value
        return (arg.minimum + arg.maximum) / 2 if arg.kind == "float" else arg.minimum
    if arg.kind == "json":
        return {"some_key": 1}
    if arg.kind == "name_path":
        return ["adapter=/tmp/adapter"] if arg.is_list else "adapter=/tmp/adapter"
    value = "x.y.Z"
    return [value] if arg.is_list else value


# Settings that the cross-field rules require beside a value (each itself refused or no-effect).
COMPANIONS = {
    "lora_modules": {"enable_lora": True},
    "prompt_adapters": {"enable_prompt_adapter": True},
    "data_parallel_size_local": {"data_parallel_size": 2},
    "collect_detailed_traces": {"otlp_traces_endpoint": "http://collector:4317"},
}


def _config(arg: Arg, value: object):
    return build_config("some/model", **{arg.dest: value, **COMPANIONS.get(arg.dest, {})})


def test_every_argument_and_variable_has_an_entry():
    assert set(ARG_SUPPORT) == {a.dest for a in CURRENT_ARGS}
    assert set(ENV_SUPPORT) == {v.name for v in ENV_VARS}
    for table in (ARG_SUPPORT, ENV_SUPPORT):
        for name, support in table.items():
            assert support.kind == "honoured" or support.reason, f"{name}: say why"


def test_partial_values_are_values_the_argument_takes():
    for arg in CURRENT_ARGS:
        support = ARG_SUPPORT[arg.dest]
        if support.kind == "partial" and arg.choices:
            assert set(support.values) <= set(arg.choices), arg.dest


@pytest.mark.parametrize(
    "arg", [a for a in CURRENT_ARGS if ARG_SUPPORT[a.dest].kind != "honoured"], ids=lambda a: a.dest
)
def test_refused_values_exit_2_and_no_effect_values_warn(arg, capsys):
    support = ARG_SUPPORT[arg.dest]
    value = _non_default(arg, avoid=support.values)
    config = _config(arg, value)
    if support.kind == "refused" or (support.kind == "partial" and support.others == "refused"):
        with pytest.raises(SystemExit) as info:
            report_support(config, "infernetes serve", environ={})
        assert info.value.code == 2
        assert f"error: argument {arg.flag}" in capsys.readouterr().err
    else:
        report = check_support(config, environ={})
        assert not any(arg.flag in e for e in report.errors), report.errors
        assert any(arg.flag in w and support.reason in w for w in report.warnings), report.warnings
    for supported in support.values:
        if supported != arg.default:
            assert not check_support(_config(arg, supported), environ={}).errors


def _env_value(var: EnvVar, avoid: tuple) -> str:
    if var.choices:
        return str(next(c for c in var.choices if c != var.default and c not in avoid))
    return {"bool": "0" if var.default else "1", "int": "7", "float": "7.5", "list": "1,2"}.get(
        var.kind, "/x"
    )


@pytest.mark.parametrize(
    "var",
    [v for v in ENV_VARS if v.name.startswith("VLLM_") and ENV_SUPPORT[v.name].kind != "honoured"],
    ids=lambda v: v.name,
)
def test_vllm_variables_set_without_effect_warn_and_refused_ones_fail(var):
    support = ENV_SUPPORT[var.name]
    report = check_support(
        build_config("some/model"), environ={var.name: _env_value(var, support.values)}
    )
    if support.kind == "refused" or (support.kind == "partial" and support.others == "refused"):
        assert any(e.startswith(f"{var.name}=") for e in report.errors), report.errors
    else:
        assert any(w.startswith(f"{var.name}=") and support.reason in w for w in report.warnings)


def test_a_zero_is_a_value_not_an_unset_default():
    report = check_support(build_config("some/model", data_parallel_rpc_port=0), environ={})
    assert any("--data-parallel-rpc-port/-dpp 0 is not supported" in e for e in report.errors)
    assert not check_support(build_config("some/model", enable_lora=False), environ={}).errors


def test_defaults_and_unset_variables_say_nothing():
    report = check_support(build_config("some/model"), environ={"CUDA_HOME": "/usr/local/cuda"})
    assert report.errors == [] and report.warnings == []


def test_serve_refuses_before_loading_anything():
    """The CLI exits 2 at once, naming the flag: no torch import, no model lookup."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "infernetes.cli.main",
            "serve",
            "no/such-model",
            "--tokenizer-mode",
            "custom",
            "--swap-space",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "error: argument --tokenizer-mode custom is not supported" in result.stderr
    assert "warning: argument --swap-space 8.0 has no effect here" in result.stderr
    config = subprocess.run(
        [
            sys.executable,
            "-m",
            "infernetes.cli.main",
            "config",
            "no/such-model",
            "--fully-sharded-loras",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert config.returncode == 2
    assert "argument --fully-sharded-loras is not supported" in config.stderr


def _tests_naming(*needles: str) -> bool:
    this = Path(__file__).name
    for folder in ("tests", "e2e"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name != this and any(n in path.read_text(errors="replace") for n in needles):
                return True
    return False


def test_every_honoured_argument_has_a_test_that_names_it():
    """Honoured (or honoured for a value besides the default) means a test exercises it."""
    untested = []
    for arg in CURRENT_ARGS:
        support = ARG_SUPPORT[arg.dest]
        exercised = support.kind == "honoured" or (
            support.kind == "partial" and any(v != arg.default for v in support.values)
        )
        if exercised and not _tests_naming(arg.flag, arg.dest, *arg.aliases):
            untested.append(arg.flag)
    honoured_vars = [
        v.name
        for v in ENV_VARS
        if v.name.startswith("VLLM_")
        and ENV_SUPPORT[v.name].kind != "no_effect"
        and ENV_SUPPORT[v.name].kind != "refused"
    ]
    untested += [name for name in honoured_vars if not _tests_naming(name)]
    assert untested == []


def test_an_unknown_vllm_variable_is_warned_with_the_name_it_may_mean():
    warnings = check_support(build_config("m"), {"VLLM_LOGING_LEVEL": "ERROR"}).warnings
    assert warnings == [
        "Unknown vLLM environment variable detected: VLLM_LOGING_LEVEL "
        "(did you mean VLLM_LOGGING_LEVEL?)"
    ]
    # known names and other prefixes say nothing
    assert not check_support(
        build_config("m"), {"VLLM_LOGGING_LEVEL": "INFO", "HF_X": "1"}
    ).warnings
