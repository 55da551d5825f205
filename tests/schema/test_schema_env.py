"""``read_env``: typed values, defaults, bad values, and Kubernetes service-link values."""

import pytest

from infernetes.schema.env import read_env


def test_defaults_when_unset_or_empty():
    assert read_env("VLLM_RPC_TIMEOUT", {}) == 180000
    assert read_env("VLLM_ATTENTION_BACKEND", {}) is None
    assert read_env("VLLM_USE_V1", {"VLLM_USE_V1": ""}) is True


def test_typed_values():
    env = {
        "VLLM_ENGINE_ITERATION_TIMEOUT_S": "120",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "VLLM_RAY_PER_WORKER_GPUS": "0.5",
        "VLLM_DISABLED_KERNELS": "a, b,,c",
        "VLLM_FUSED_MOE_CHUNK_SIZE": "64K",
        "VLLM_LOGGING_LEVEL": "debug",
        "VLLM_ATTENTION_BACKEND": "triton_attn",
        "VLLM_CACHE_ROOT": "~/cache",
    }
    assert read_env("VLLM_ENGINE_ITERATION_TIMEOUT_S", env) == 120
    assert read_env("VLLM_ALLOW_LONG_MAX_MODEL_LEN", env) is True
    assert read_env("VLLM_RAY_PER_WORKER_GPUS", env) == 0.5
    assert read_env("VLLM_DISABLED_KERNELS", env) == ("a", "b", "c")
    assert read_env("VLLM_FUSED_MOE_CHUNK_SIZE", env) == 65536
    assert read_env("VLLM_LOGGING_LEVEL", env) == "DEBUG"
    assert read_env("VLLM_ATTENTION_BACKEND", env) == "TRITON_ATTN"
    assert not read_env("VLLM_CACHE_ROOT", env).startswith("~")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_RPC_TIMEOUT", "soon"),
        ("VLLM_USE_V1", "maybe"),
        ("VLLM_WORKER_MULTIPROC_METHOD", "thread"),
        ("VLLM_FLASH_ATTN_VERSION", "4"),
    ],
)
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        read_env(name, {name: value})


def test_service_link_port_is_ignored_with_a_warning(capsys):
    assert read_env("VLLM_PORT", {"VLLM_PORT": "tcp://10.0.0.7:8000"}) is None
    assert "service link" in capsys.readouterr().err
    # read again (serve reads a variable in several places): said once
    assert read_env("VLLM_PORT", {"VLLM_PORT": "tcp://10.0.0.7:8000"}) is None
    assert capsys.readouterr().err == ""
    assert read_env("VLLM_PORT", {"VLLM_PORT": "5555"}) == 5555


def test_unknown_variable():
    with pytest.raises(KeyError):
        read_env("VLLM_NOT_A_THING", {})
