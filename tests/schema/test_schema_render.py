"""``to_argv`` is the inverse of parsing: parse(render(config)) == config, for every argument."""

import pytest

from infernetes.schema.args import CURRENT_ARGS, Arg
from infernetes.schema.config import build_config
from infernetes.schema.parser import parse_serve_args
from infernetes.schema.render import to_argv

# Arguments whose sample value needs others set for the cross-field rules to hold.
COMPANIONS = {
    "lora_modules": {"enable_lora": True},
    "prompt_adapters": {"enable_prompt_adapter": True},
    "collect_detailed_traces": {"otlp_traces_endpoint": "http://collector:4317"},
    "enable_auto_tool_choice": {"tool_call_parser": "hermes"},
    "max_long_partial_prefills": {"max_num_partial_prefills": 4},
    "data_parallel_size_local": {"data_parallel_size": 4},
    "max_num_seqs": {"max_num_batched_tokens": 8192},
    "headless": {"nnodes": 2, "node_rank": 1, "tensor_parallel_size": 2},
    "nnodes": {"tensor_parallel_size": 3},
    "node_rank": {"nnodes": 4, "headless": True, "tensor_parallel_size": 4},
}


# JSON arguments whose keys are checked.
SAMPLES = {"structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True}}


def sample(arg: Arg):
    """A valid value different from the default."""
    if arg.dest in SAMPLES:
        return SAMPLES[arg.dest]
    if arg.kind == "bool":
        return not arg.default
    if arg.choices is not None:
        choice = next(c for c in arg.choices if c != arg.default)
        return [choice] if arg.is_list else choice
    single = {
        "int": (3 if arg.default != 3 else 4)
        if arg.maximum is None or arg.maximum >= 4
        else arg.maximum,
        "size": 4096,
        "float": 0.5,
        "str": "some value",
        "json": {"key": [1, {"nested": "v"}], "flag": True}
        if arg.default != ["*"]
        else ["https://a.example"],
        "name_path": {"name": "b", "path": "/q", "base_model_name": "m"},
        "token": "hf_secret",
    }[arg.kind]
    if arg.kind == "name_path":
        return [{"name": "a", "path": "/p"}, single]
    return [single, single] if arg.is_list else single


@pytest.mark.parametrize("arg", CURRENT_ARGS, ids=lambda a: a.name)
def test_round_trip_of_each_argument(arg):
    config = build_config(
        **{"model": "org/model", arg.dest: sample(arg), **COMPANIONS.get(arg.dest, {})}
    )
    assert config.non_defaults()[arg.dest] is not None
    assert parse_serve_args(to_argv(config)) == config


def test_round_trip_of_defaults():
    config = build_config()
    assert to_argv(config) == []
    assert parse_serve_args(to_argv(config)) == config


def test_round_trip_of_many_arguments_at_once():
    values = {}
    for arg in CURRENT_ARGS:
        values[arg.dest] = sample(arg)
    values.update(
        {
            "max_num_partial_prefills": 4,
            "data_parallel_size": 4,
            "max_num_batched_tokens": 8192,
            "enable_lora": True,
            "enable_prompt_adapter": True,
            "enable_chunked_prefill": True,
            "max_cpu_loras": 4,
            "tool_call_parser": "hermes",
            "otlp_traces_endpoint": "http://c:4317",
            # one node: several need a data-parallel size of 1 (their own test renders them)
            "nnodes": 1,
            "node_rank": 0,
            "headless": False,
            "async_scheduling": True,
            "pipeline_parallel_size": 1,  # async scheduling refuses pipeline parallelism
            "api_server_count": 1,  # several API processes refuse data parallelism (own test)
        }
    )
    config = build_config(**values)
    assert parse_serve_args(to_argv(config)) == config


def test_none_over_a_non_empty_default():
    config = build_config("m", hf_overrides=None, rope_scaling=None)
    assert "--hf-overrides=None" in to_argv(config)
    assert parse_serve_args(to_argv(config)) == config


def test_token_alone_renders_as_a_bare_flag():
    config = build_config("m", hf_token=True)
    assert to_argv(config) == ["m", "--hf-token"]
    assert parse_serve_args(["m", "--hf-token"]) == config


def test_render_from_a_mapping_of_non_defaults():
    argv = to_argv({"model": "m", "max_num_seqs": 8, "enforce_eager": True})
    assert argv == ["m", "--enforce-eager", "--max-num-seqs=8"]
    with pytest.raises(KeyError):
        to_argv({"no_such_arg": 1})


def test_values_with_leading_dashes_survive():
    config = build_config("m", seed=-1, chat_template="--weird")
    assert parse_serve_args(to_argv(config)) == config
