"""``--config file.yaml``: command line > file > defaults."""

import pytest

from infernetes.schema.parser import parse_serve_args, parse_with_notices


@pytest.fixture
def config_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "serve.yaml"
        path.write_text(text)
        return str(path)

    return write


def test_file_values_fill_in(config_file):
    path = config_file(
        "model: org/model\n"
        "max-num-seqs: 16\n"
        "max_model_len: 4k\n"
        "enforce-eager: true\n"
        "enable-prefix-caching: false\n"
        "served-model-name: [a, b]\n"
        "hf-overrides: {rope_theta: 1000000}\n"
        "tensor-parallel-size: 2\n"
    )
    config = parse_serve_args(["--config", path])
    assert (
        config.model == "org/model" and config.max_num_seqs == 16 and config.max_model_len == 4000
    )
    assert config.enforce_eager is True and config.enable_prefix_caching is False
    assert config.served_model_name == ["a", "b"] and config.hf_overrides == {"rope_theta": 1000000}
    assert config.tensor_parallel_size == 2


def test_command_line_wins_over_file(config_file):
    path = config_file(
        "max-num-seqs: 16\nport: 9000\nserved-model-name: [a, b]\nenforce-eager: true\n"
    )
    config = parse_serve_args(
        [
            "m",
            f"--config={path}",
            "--max-num-seqs",
            "4",
            "--served-model-name",
            "c",
            "--no-enforce-eager",
        ]
    )
    assert config.max_num_seqs == 4 and config.served_model_name == ["c"]
    assert config.enforce_eager is False
    assert config.port == 9000
    assert config.model == "m"


def test_command_line_json_keys_merge_onto_file_object(config_file):
    path = config_file("hf-overrides:\n  rope_theta: 10000\n  a: 1\n")
    config = parse_serve_args(["--config", path, "--hf-overrides.rope_theta", "1e6"])
    assert config.hf_overrides == {"rope_theta": 1e6, "a": 1}


def test_deprecated_keys_in_file_warn_and_map(config_file):
    path = config_file("worker-use-ray: true\n")
    config, notices = parse_with_notices(["--config", path])
    assert config.distributed_executor_backend == "ray"
    assert any("--worker-use-ray" in n for n in notices)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no-such-arg: 1\n", "unknown argument 'no-such-arg'"),
        ("max-num-seqs: lots\n", "--max-num-seqs"),
        ("- a\n- b\n", "must hold a mapping"),
        ("key: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files_exit_2(capsys, config_file, text, message):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["--config", config_file(text)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_file_exits_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["--config", str(tmp_path / "absent.yaml")])
    assert exc.value.code == 2
    assert "cannot read" in capsys.readouterr().err
