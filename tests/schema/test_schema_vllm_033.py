"""vLLM 0.33's `serve` command line parses here: every option string of its parser, the
--enable-x/--disable-x negations, its short aliases and the shorthands for JSON keys."""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

import pytest

from infernetes.schema.args import CURRENT_ARGS, get_arg
from infernetes.schema.parser import build_parser, parse_with_notices
from infernetes.schema.support import ARG_SUPPORT
from infernetes.schema.support_check import check_support

DATA = Path(__file__).parent / "data" / "vllm-0.33.0-serve-options.txt"
VLLM_OPTIONS = [line for line in DATA.read_text().splitlines() if line and not line.startswith("#")]
SAMPLE = {
    "int": "2",
    "float": "0.5",
    "size": "1k",
    "json": "{}",
    "str": "x",
    "token": "t",
    "name_path": "adapter=/tmp/adapter",
}


@cache
def _actions() -> dict[str, argparse.Action]:
    return {s: action for action in build_parser()._actions for s in action.option_strings}


def test_the_option_list_is_vllm_033s():
    assert len(VLLM_OPTIONS) == 433
    assert {"--spec-tokens", "-dcp", "--disable-prefix-caching", "--attention-config"} <= set(
        VLLM_OPTIONS
    )


@pytest.mark.parametrize("option", [o for o in VLLM_OPTIONS if o != "--config"])
def test_every_vllm_033_option_parses(option, capsys):
    """Given alone (a flag) or with a valid value, no option is an unrecognized argument."""
    action = _actions()[option]
    argv = ["m", option]
    if action.nargs != 0:
        arg = get_arg(action.dest)
        argv.append(str(arg.choices[-1]) if arg.choices else SAMPLE[arg.kind])
    try:
        parse_with_notices(argv)
    except SystemExit:  # a cross-argument rule (e.g. --lora-modules needs --enable-lora)
        error = capsys.readouterr().err
        assert "unrecognized arguments" not in error and "invalid choice" not in error, error


def test_every_new_argument_has_a_support_entry_that_says_why():
    for option in VLLM_OPTIONS:
        if option == "--config":
            continue
        arg = get_arg(_actions()[option].dest)
        if arg.stored:
            support = ARG_SUPPORT[arg.dest]
            assert support.kind == "honoured" or support.reason, arg.name


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["--disable-prefix-caching"], "enable_prefix_caching", False),
        (["--enable-prefix-caching"], "enable_prefix_caching", True),
        (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
        (["--disable-prefix-caching=false"], "enable_prefix_caching", True),
        (["--disable-prefix-caching", "true"], "enable_prefix_caching", False),
        (["--disable-chunked-prefill"], "enable_chunked_prefill", False),
        (["--enable-uvicorn-access-log"], "disable_uvicorn_access_log", False),
        (["--disable-uvicorn-access-log"], "disable_uvicorn_access_log", True),
        (["--enable-uvicorn-access-log=false"], "disable_uvicorn_access_log", True),
        (["--no-disable-uvicorn-access-log"], "disable_uvicorn_access_log", False),
        (["--disable-expert-parallel"], "enable_expert_parallel", False),
        (["-ep"], "enable_expert_parallel", True),
    ],
)
def test_enable_and_disable_negate_each_other(argv, dest, value):
    config, notices = parse_with_notices(["m", *argv])
    assert getattr(config, dest) is value
    assert notices == []


def test_a_negation_that_is_an_argument_of_its_own_keeps_its_meaning():
    """--disable-log-requests is the deprecated flag, not the negation of --enable-log-requests."""
    config, notices = parse_with_notices(["m", "--disable-log-requests"])
    assert config.enable_log_requests is False
    assert any("--disable-log-requests is deprecated" in n for n in notices)
    assert "--disable-log-requests" not in _actions()["--enable-log-requests"].option_strings


def test_short_aliases_of_vllm_033():
    config, _ = parse_with_notices(
        ["m", "-cc", '{"level": 0}', "-sc", '{"method": "ngram", "num_speculative_tokens": 2}']
    )
    assert config.compilation_config == {"level": 0}
    assert config.speculative_config == {"method": "ngram", "num_speculative_tokens": 2}
    config, _ = parse_with_notices(["m", "--device-memory-utilization", "0.5"])
    assert config.gpu_memory_utilization == 0.5
    for alias, flag in [
        ("-dcp", "--decode-context-parallel-size"),
        ("-pcp", "--prefill-context-parallel-size"),
        ("-dpn", "--data-parallel-rank"),
        ("-dph", "--data-parallel-hybrid-lb"),
        ("-dpe", "--data-parallel-external-lb"),
        ("-dpm", "--data-parallel-multi-port-external-lb"),
        ("-ac", "--attention-config"),
        ("-dc", "--diffusion-config"),
    ]:
        assert get_arg(alias) is get_arg(flag)
    config, _ = parse_with_notices(["m", "-dcp", "2", "-ac.backend", "FLASH_ATTN"])
    assert config.decode_context_parallel_size == 2
    assert config.attention_config == {"backend": "FLASH_ATTN"}
    errors = check_support(config, environ={}).errors
    assert any("--decode-context-parallel-size/-dcp 2 is not supported" in e for e in errors)
    assert any("--attention-config/-ac" in e for e in errors)


def test_spec_shorthands_fill_the_speculative_config_without_a_notice():
    config, notices = parse_with_notices(
        ["m", "--spec-method", "ngram", "--spec-tokens", "4", "--spec-model", "[ngram]"]
    )
    assert notices == []
    assert config.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert "spec_method" not in config.to_dict()
    assert check_support(config, environ={}).errors == []
    eagle, _ = parse_with_notices(["m", "--spec-method", "eagle3", "--spec-model", "org/draft"])
    assert eagle.speculative_config == {"method": "eagle3", "model": "org/draft"}
    assert check_support(eagle, environ={}).errors == []
    suffix, _ = parse_with_notices(["m", "--spec-method", "suffix"])
    errors = check_support(suffix, environ={}).errors
    assert any("--speculative-config.method suffix is not supported" in e for e in errors)


def test_cudagraph_shorthands_fill_the_compilation_config():
    config, _ = parse_with_notices(
        ["m", "--cudagraph-capture-sizes", "1", "2", "4", "--max-cudagraph-capture-size", "4"]
    )
    assert config.compilation_config == {
        "cudagraph_capture_sizes": [1, 2, 4],
        "max_cudagraph_capture_size": 4,
    }


def test_mm_processor_device_is_a_key_of_mm_processor_kwargs():
    config, _ = parse_with_notices(["m", "--mm-processor-device", "cpu"])
    assert config.mm_processor_kwargs == {"device": "cpu"}
    warnings = check_support(config, environ={}).warnings  # the processor gets it
    assert not any("--mm-processor-kwargs" in w for w in warnings)


def test_runner_generate_is_honoured_and_the_others_refused():
    config, _ = parse_with_notices(["m", "--runner", "generate"])
    assert config.runner == "generate"
    assert check_support(config, environ={}).errors == []
    pooling, _ = parse_with_notices(["m", "--runner", "pooling"])
    assert any("--runner pooling is not supported" in e for e in check_support(pooling).errors)


def test_shorthands_are_not_config_fields_nor_crd_fields():
    from infernetes.operator.engine_schema import engine_args

    shorthands = {"spec_method", "spec_model", "spec_tokens", "cudagraph_capture_sizes"}
    assert shorthands.isdisjoint(a.dest for a in CURRENT_ARGS)
    assert shorthands.isdisjoint(a.dest for a in engine_args(get_arg(d) for d in shorthands))


def test_a_shorthand_overrides_its_key_in_the_json_given_beside_it():
    whole = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
    config, _ = parse_with_notices(["m", "--speculative-config", whole, "--spec-tokens", "5"])
    assert config.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
    }
    # a deprecated spelling does not: the value under the new name wins
    config, notices = parse_with_notices(["m", "-sc", whole, "--num-speculative-tokens", "7"])
    assert config.speculative_config["num_speculative_tokens"] == 3
    assert any("--num-speculative-tokens is deprecated" in n for n in notices)
