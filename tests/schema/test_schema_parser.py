"""``parse_serve_args``: every command-line form ``vllm serve`` accepts."""

import pytest

from infernetes.schema.parser import parse_serve_args


def parse(*argv: str):
    return parse_serve_args(list(argv))


def fails(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_defaults():
    config = parse()
    assert config.model == "facebook/opt-125m"
    assert config.port == 8000 and config.gpu_memory_utilization == 0.9
    assert config.max_model_len is None and config.dtype == "auto"


def test_model_positional_or_flag():
    assert parse("org/model").model == "org/model"
    assert parse("--model", "org/model").model == "org/model"
    assert parse("org/model", "--model", "org/model").model == "org/model"


def test_model_positional_conflicting_with_flag(capsys):
    assert "--model" in fails(capsys, "a/b", "--model", "c/d")


def test_booleans_and_their_negation():
    assert parse("--enforce-eager").enforce_eager is True
    assert parse("--enforce-eager", "--no-enforce-eager").enforce_eager is False
    assert parse("--no-enable-prefix-caching").enable_prefix_caching is False
    assert parse().enable_prefix_caching is None


def test_booleans_with_explicit_values():
    assert parse("--enable-chunked-prefill", "False").enable_chunked_prefill is False
    assert parse("--trust-remote-code=true").trust_remote_code is True
    assert parse("--trust-remote-code", "m").model == "m"


def test_underscores_work_as_dashes():
    config = parse(
        "--max_num_seqs",
        "8",
        "--speculative_config",
        '{"method": "ngram"}',
        "--preemption_mode=swap",
    )
    assert config.max_num_seqs == 8
    assert config.speculative_config == {"method": "ngram"}
    assert config.preemption_mode == "swap"


def test_short_aliases():
    config = parse("-tp", "2", "-pp", "2", "-dp", "2", "-q", "awq")
    assert (
        config.tensor_parallel_size,
        config.pipeline_parallel_size,
        config.data_parallel_size,
    ) == (2, 2, 2)
    assert config.quantization == "awq"
    # -dp and -asc above 1 together are refused (schema/rules.py), so -asc on its own
    assert parse("-asc", "3").api_server_count == 3


@pytest.mark.parametrize("argv", [["-O3"], ["-O", "3"], ["--compilation-config", "3"], ["-O=3"]])
def test_optimization_level(argv):
    assert parse(*argv).compilation_config == {"level": 3}


def test_compilation_config_json_and_keys():
    config = parse("-O", '{"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}')
    assert config.compilation_config == {"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}
    assert parse("-O.level", "2").compilation_config == {"level": 2}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2048", 2048), ("1k", 1000), ("1K", 1024), ("25.6k", 25600), ("auto", None), ("None", None)],
)
def test_max_model_len_human_sizes(text, expected):
    assert parse("--max-model-len", text).max_model_len == expected


def test_kv_cache_memory_bytes_takes_sizes():
    assert parse("--kv-cache-memory-bytes", "4G").kv_cache_memory_bytes == 4 * 2**30


def test_json_argument_whole():
    assert parse("--hf-overrides", '{"rope_theta": 1000000}').hf_overrides == {
        "rope_theta": 1000000
    }


def test_json_argument_by_keys():
    config = parse(
        "--hf-overrides.rope_theta",
        "1e6",
        "--hf-overrides.rope_scaling.factor=2",
        "--hf-overrides.rope_scaling.rope_type",
        "dynamic",
        "--hf-overrides.name",
        "x",
    )
    assert config.hf_overrides == {
        "rope_theta": 1e6,
        "rope_scaling": {"factor": 2, "rope_type": "dynamic"},
        "name": "x",
    }


def test_json_keys_merge_onto_a_whole_value():
    config = parse(
        "--override-generation-config",
        '{"temperature": 0.5}',
        "--override-generation-config.top_p",
        "0.9",
    )
    assert config.override_generation_config == {"temperature": 0.5, "top_p": 0.9}


def test_json_values_are_read_only():
    config = parse("--hf-overrides", '{"a": 1}')
    with pytest.raises(TypeError):
        config.hf_overrides["a"] = 2


def test_bad_json(capsys):
    assert "--hf-overrides" in fails(capsys, "--hf-overrides", "{oops")


def test_dotted_keys_only_for_json_arguments(capsys):
    assert "--max-num-seqs.x" in fails(capsys, "--max-num-seqs.x", "1")


def test_list_arguments():
    config = parse("--cuda-graph-sizes", "1", "2", "4", "--served-model-name", "a", "b")
    assert config.cuda_graph_sizes == [1, 2, 4]
    assert config.served_model_name == ["a", "b"]


def test_repeatable_list_argument_accumulates():
    assert parse("--middleware", "a.b", "--middleware", "c.d").middleware == ["a.b", "c.d"]
    assert parse("--served-model-name", "a", "--served-model-name", "b").served_model_name == ["b"]


def test_lora_modules_in_both_forms():
    config = parse(
        "--enable-lora",
        "--lora-modules",
        "a=/p1",
        "b=/p2",
        '{"name": "c", "path": "/p3", "base_model_name": "m"}',
    )
    assert config.lora_modules == [
        {"name": "a", "path": "/p1"},
        {"name": "b", "path": "/p2"},
        {"name": "c", "path": "/p3", "base_model_name": "m"},
    ]


def test_model_after_a_list_argument_needs_its_own_place():
    config = parse("m", "--served-model-name", "x")
    assert config.model == "m" and config.served_model_name == ["x"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--limit-mm-per-prompt", "image=4"],
        ["--limit-mm-per-prompt", '{"image": 4}'],
        ["--limit-mm-per-prompt.image", "4"],
    ],
)
def test_limit_mm_per_prompt_forms(argv):
    assert parse(*argv).limit_mm_per_prompt == {"image": 4}


def test_limit_mm_per_prompt_several_modalities():
    assert parse("--limit-mm-per-prompt", "image=16,video=2").limit_mm_per_prompt == {
        "image": 16,
        "video": 2,
    }


def test_choices_are_case_insensitive():
    assert parse("--attention-backend", "triton_attn").attention_backend == "TRITON_ATTN"


def test_tool_parser_plugin_opens_parser_names():
    config = parse("--tool-parser-plugin", "/plugins/mine.py", "--tool-call-parser", "mine")
    assert config.tool_call_parser == "mine"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--no-such-flag"], "--no-such-flag"),
        (["--max-num-seqs", "many"], "--max-num-seqs"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--dtype", "int3"], "--dtype"),
        (["--tool-call-parser", "nope"], "--tool-call-parser"),
        (["--max-model-len", "1.5K"], "--max-model-len"),
        (["--port", "70000"], "--port"),
        (["--lora-modules", "nopath"], "--lora-modules"),
        (["--block-size", "7"], "--block-size"),
        (["--enable-chunked-prefill=perhaps"], "--enable-chunked-prefill"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(capsys, argv, named):
    assert named in fails(capsys, *argv)


def test_unknown_flag_suggests_a_close_one(capsys):
    assert "did you mean --max-num-seqs?" in fails(capsys, "--max-num-seq", "4")


def test_negative_numbers_are_values():
    assert parse("--seed", "-1").seed == -1


def test_bad_choice_lists_the_allowed_values(capsys):
    err = fails(capsys, "--kv-cache-dtype", "fp4")
    assert "auto, fp8, fp8_e4m3, fp8_e5m2" in err


def test_gpu_memory_utilization_one_is_allowed():
    assert parse("--gpu-memory-utilization", "1").gpu_memory_utilization == 1.0


def test_config_is_immutable():
    config = parse()
    with pytest.raises(AttributeError):
        config.port = 1
