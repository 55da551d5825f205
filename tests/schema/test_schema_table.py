"""The argument and env tables cover every flag, alias, choice and variable of the references."""

from functools import cache
from pathlib import Path

import pytest

from infernetes.schema.args import ARGS, BY_DEST, CURRENT_ARGS, GROUPS, get_arg
from infernetes.schema.env import ENV_BY_NAME, ENV_VARS
from infernetes.schema.parser import build_parser, parse_serve_args

DATA = Path(__file__).parent / "data"


def _rows(name: str) -> list[list[str]]:
    lines = (DATA / name).read_text().splitlines()
    return [line.split("\t") for line in lines if line and not line.startswith("#")]


@cache
def _option_strings() -> frozenset[str]:
    return frozenset(s for action in build_parser()._actions for s in action.option_strings)


REFERENCE_FLAGS = [row[0] for row in _rows("reference_flags.txt")]


def test_reference_flag_list_is_substantial():
    assert len(REFERENCE_FLAGS) > 200


@pytest.mark.parametrize("flag", REFERENCE_FLAGS)
def test_every_reference_flag_is_known_to_the_parser(flag):
    assert flag in _option_strings()


@pytest.mark.parametrize(("alias", "flag"), _rows("reference_aliases.txt"))
def test_short_aliases(alias, flag):
    assert get_arg(alias) is get_arg(flag)
    assert alias in _option_strings()


@pytest.mark.parametrize(("flag", "choice"), _rows("reference_choices.txt"))
def test_every_listed_choice_is_valid(flag, choice):
    arg = get_arg(flag)
    value = int(choice) if arg.kind == "int" else choice
    assert value in arg.choices


@pytest.mark.parametrize(
    ("flag", "choice"), [r for r in _rows("reference_choices.txt") if not get_arg(r[0]).deprecated]
)
def test_every_listed_choice_parses(flag, choice):
    argv = ["m", flag, choice]
    if flag == "--collect-detailed-traces":
        argv += ["--otlp-traces-endpoint", "http://collector:4317"]
    config = parse_serve_args(argv)
    value = getattr(config, get_arg(flag).dest)
    assert str(value[0] if isinstance(value, list) else value) == choice


@pytest.mark.parametrize("name", [row[0] for row in _rows("reference_env_vars.txt")])
def test_every_reference_env_var_is_declared(name):
    assert name in ENV_BY_NAME


def test_each_arg_is_well_formed():
    for arg in ARGS:
        assert arg.help, arg.name
        assert arg.group in GROUPS
        assert arg.dest == arg.name.replace("-", "_")
        if arg.choices is not None and arg.default is not None and not arg.is_list:
            assert arg.default in arg.choices, arg.name
        if arg.replaced_by:
            target = arg.replaced_by.split("=")[0].split(".")[0]
            assert target in BY_DEST and not BY_DEST[target].deprecated, arg.name
    assert len({a.dest for a in ARGS}) == len(ARGS)


def test_deprecated_args_are_not_config_fields():
    assert all(not arg.deprecated for arg in CURRENT_ARGS)
    assert {"worker_use_ray", "speculative_model", "image_input_type"}.isdisjoint(
        a.dest for a in CURRENT_ARGS
    )


def test_every_group_has_arguments():
    assert {arg.group for arg in CURRENT_ARGS} == set(GROUPS)


def test_operator_owned_and_secret_flags():
    owned = {a.name for a in ARGS if a.operator_owned}
    assert {"host", "port", "model"} <= owned
    assert {a.name for a in ARGS if a.secret} == {"api-key", "hf-token"}


def test_env_vars_are_well_formed():
    for var in ENV_VARS:
        assert var.help
        if var.choices and var.default is not None:
            assert var.default in var.choices
    assert ENV_BY_NAME["VLLM_API_KEY"].secret and ENV_BY_NAME["HF_TOKEN"].secret


def test_engine_arguments_are_declared():
    needed = [
        "model",
        "tokenizer",
        "revision",
        "dtype",
        "max_model_len",
        "seed",
        "block_size",
        "gpu_memory_utilization",
        "num_gpu_blocks_override",
        "kv_cache_memory_bytes",
        "kv_cache_dtype",
        "enable_prefix_caching",
        "prefix_caching_hash_algo",
        "max_num_batched_tokens",
        "max_num_seqs",
        "enable_chunked_prefill",
        "max_num_partial_prefills",
        "max_long_partial_prefills",
        "long_prefill_token_threshold",
        "scheduling_policy",
        "max_logprobs",
        "load_format",
        "skip_tokenizer_init",
        "trust_remote_code",
        "hf_overrides",
        "generation_config",
        "override_generation_config",
        "task",
        "enforce_eager",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "served_model_name",
        "host",
        "port",
        "api_key",
    ]
    assert set(needed) <= {a.dest for a in CURRENT_ARGS}
