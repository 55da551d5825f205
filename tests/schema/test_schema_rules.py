"""The cross-field rules, each through the command line (exit 2) and the keyword form."""

import pytest

from infernetes.schema.config import ConfigError, build_config
from infernetes.schema.parser import parse_serve_args

RULES = [
    (dict(enable_auto_tool_choice=True), "--tool-call-parser"),
    (dict(enable_lora=True, max_loras=4, max_cpu_loras=2), "--max-cpu-loras"),
    (dict(lora_modules=["a=/p"]), "--enable-lora"),
    (dict(prompt_adapters=["a=/p"]), "--enable-prompt-adapter"),
    (
        dict(enable_chunked_prefill=False, max_model_len=8192, max_num_batched_tokens=2048),
        "--max-num-batched-tokens",
    ),
    (dict(max_num_batched_tokens=16, max_num_seqs=32), "--max-num-seqs"),
    (dict(max_num_partial_prefills=2, max_long_partial_prefills=3), "--max-long-partial-prefills"),
    (dict(enable_chunked_prefill=False, max_num_partial_prefills=2), "--max-num-partial-prefills"),
    (dict(collect_detailed_traces=["all"]), "--otlp-traces-endpoint"),
    (dict(data_parallel_size=2, data_parallel_size_local=4), "--data-parallel-size-local"),
    (dict(api_server_count=2, data_parallel_size=2), "--api-server-count (2) above 1"),
    (dict(gpu_memory_utilization=0.0), "--gpu-memory-utilization"),
    (dict(nnodes=2, tensor_parallel_size=2, node_rank=2, headless=True), "--node-rank (2)"),
    (dict(nnodes=2, tensor_parallel_size=3), "must be divisible by --nnodes"),
    (dict(headless=True), "--headless is for the nodes after the first"),
    (dict(nnodes=2, tensor_parallel_size=2, headless=True), "node 0 serves the API"),
    (dict(nnodes=2, tensor_parallel_size=2, node_rank=1), "--node-rank 1 needs --headless"),
    (
        dict(nnodes=2, tensor_parallel_size=2, data_parallel_size=2),
        "--data-parallel-size (2) must be 1 with --nnodes",
    ),
]


@pytest.mark.parametrize(("values", "named"), RULES)
def test_rule_in_keyword_form(values, named):
    with pytest.raises(ConfigError) as exc:
        build_config("m", **values)
    assert named in str(exc.value)


def _argv(values: dict) -> list[str]:
    argv = ["m"]
    for dest, value in values.items():
        flag = "--" + dest.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append(flag.replace("--", "--no-", 1))
        elif isinstance(value, list):
            argv += [flag, *value]
        else:
            argv += [flag, str(value)]
    return argv


@pytest.mark.parametrize(("values", "named"), RULES)
def test_rule_on_the_command_line(capsys, values, named):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(_argv(values))
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_valid_combinations_pass():
    build_config("m", nnodes=2, tensor_parallel_size=2)
    build_config("m", nnodes=2, pipeline_parallel_size=4, node_rank=1, headless=True)
    build_config("m", enable_auto_tool_choice=True, tool_call_parser="hermes")
    build_config("m", enable_lora=True, max_loras=2, max_cpu_loras=2, lora_modules=["a=/p"])
    build_config("m", enable_chunked_prefill=False, max_model_len=2048, max_num_batched_tokens=2048)
    build_config("m", enable_chunked_prefill=True, max_model_len=8192, max_num_batched_tokens=2048)
    build_config("m", collect_detailed_traces=["all"], otlp_traces_endpoint="http://c:4317")
