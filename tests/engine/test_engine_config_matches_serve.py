"""``infernetes config`` says what ``serve`` would: the same context length, dtype and scheduler
limits (both run the engine's ``resolve_config``), and the same exit and message for a setting
``serve`` refuses, whether it refuses it before starting (exit 2) or when the engine starts
(exit 1)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from infernetes.runtime.engine.engine_config import resolve_config
from infernetes.runtime.preflight import check_settings
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams
from infernetes.cli import main as cli_main
from infernetes.schema.choices import DTYPES
from infernetes.schema.config import build_config
from infernetes.schema.env import ENV_VARS, read_env
from infernetes.schema.parser import parse_serve_args


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what `config` sets; restored after each test


def config_exit(argv: list[str], capsys) -> tuple[int, str, dict]:
    """``infernetes config``'s exit status, the last stderr line and the flat printed config."""
    try:
        code = cli_main.main(["config", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    printed = json.loads(captured.out) if code == 0 else {}
    flat = {key: value for group in printed.values() for key, value in group.items()}
    lines = captured.err.strip().splitlines()
    return code, lines[-1] if lines else "", flat


def serve_exit(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``infernetes serve``'s exit status and its stderr, as a process."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "infernetes.cli.main", "serve", *argv, "--port", str(port)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return result.returncode, result.stderr


def engine_max_model_len(argv: list[str]) -> int:
    runtime, _ = resolve_config(parse_serve_args(argv))
    return runtime.model.max_model_len


YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512}


@pytest.mark.parametrize(
    ("architecture", "overrides", "args", "expected"),
    [
        # DeepSeek-V3's own: yarn over 4096 original positions, factor 40 (vLLM: 163840)
        (
            "DeepseekV3ForCausalLM",
            dict(
                max_position_embeddings=163840,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 40.0,
                    "original_max_position_embeddings": 4096,
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                },
            ),
            [],
            163840,
        ),
        # Phi-3's LongRoPE: max_position_embeddings is already the long length
        (
            "Phi3ForCausalLM",
            dict(
                max_position_embeddings=4096,
                original_max_position_embeddings=256,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.5, 2.0, 3.0],
                    "long_factor": [2.0, 4.0, 8.0, 16.0],
                    "original_max_position_embeddings": 256,
                },
            ),
            [],
            4096,
        ),
        ("Gemma2ForCausalLM", {}, [], 512),
        ("Gemma2ForCausalLM", {}, ["--disable-sliding-window"], 256),  # capped at the window
        ("LlamaForCausalLM", {}, ["--rope-scaling", json.dumps(YARN)], 1024),
        ("LlamaForCausalLM", {}, ["--hf-overrides", '{"max_position_embeddings": 300}'], 300),
    ],
    ids=["deepseek-yarn", "phi3-longrope", "gemma2", "gemma2-no-window", "rope-scaling", "hf"],
)
def test_config_and_serve_derive_one_context_length(
    model_factory, capsys, architecture, overrides, args, expected
):
    path = model_factory(architecture, **overrides)
    code, _, printed = config_exit([path, *args], capsys)
    assert code == 0
    assert printed["max_model_len"] == engine_max_model_len([path, *args]) == expected


def test_rope_scaling_serves(model_factory):
    path = model_factory("LlamaForCausalLM")
    llm = LLM(path, rope_scaling=YARN, num_gpu_blocks_override=80, max_num_seqs=2)
    assert llm.llm_engine.engine_core.config.model.max_model_len == 1024
    [output] = llm.generate(SAMPLE_PROMPTS[0], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(output.outputs[0].token_ids) == 4


def test_config_prints_what_the_engine_resolves(model_factory, capsys):
    path = model_factory("LlamaForCausalLM")
    events = {"enable_kv_cache_events": True, "topic": "kv"}
    code, _, printed = config_exit(
        [path, "--enforce-eager", "--kv-events-config", json.dumps(events)], capsys
    )
    runtime, _ = resolve_config(build_config(path, enforce_eager=True, kv_events_config=events))
    assert code == 0
    # vLLM's defaults filled in, as the engine publishes with them
    assert printed["kv_events_config"] == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": None,
        "buffer_steps": 10_000,
        "hwm": 100_000,
        "max_queue_size": 100_000,
        "topic": "kv",
    }
    assert runtime.kv_events is not None and runtime.kv_events.publishes
    assert printed["dtype"] == str(runtime.model.info.dtype).removeprefix("torch.")
    assert printed["max_num_batched_tokens"] == runtime.scheduler.max_num_batched_tokens
    assert printed["block_size"] == runtime.cache.block_size
    assert printed["enable_prefix_caching"] is runtime.cache.enable_prefix_caching


def test_config_refuses_a_context_longer_than_the_model(model_factory, capsys, monkeypatch):
    path = model_factory("LlamaForCausalLM")
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    code, line, _ = config_exit([path, "--max-model-len", "1K"], capsys)
    assert code == 1 and "max_model_len=1024 is longer than" in line
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert config_exit([path, "--max-model-len", "1K"], capsys)[2]["max_model_len"] == 1024


@pytest.mark.parametrize("model_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_config_prints_the_dtype_the_engine_loads(model_factory, capsys, dtype, model_dtype):
    path = model_factory("LlamaForCausalLM", dtype=model_dtype)
    code, _, printed = config_exit([path, "--dtype", dtype], capsys)
    runtime, _ = resolve_config(build_config(path, dtype=dtype))
    assert code == 0
    assert getattr(torch, printed["dtype"]) == runtime.model.info.dtype


REFUSED = [
    ({"VLLM_LOGGING_LEVEL": "VERBOSE"}, [], 2, "VLLM_LOGGING_LEVEL: invalid value 'VERBOSE'"),
    ({"VLLM_ENGINE_ITERATION_TIMEOUT_S": "abc"}, [], 2, "VLLM_ENGINE_ITERATION_TIMEOUT_S"),
    (
        {},
        ["--override-generation-config", '{"presence_penalty": 0.5}'],
        2,
        "override_generation_config key 'presence_penalty' is not supported",
    ),
    (
        {},
        ["--compilation-config", '{"levle": 3}'],
        2,
        "compilation_config has unknown key(s) levle",
    ),
    (
        {},
        ["--kv-transfer-config", '{"kv_connector": "RecordingConnector", "kv_role": "kv_sender"}'],
        2,
        "kv_transfer_config.kv_role 'kv_sender' is not one of",
    ),
    (
        {},
        ["--kv-transfer-config", '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}'],
        2,
        "the OffloadingConnector needs one of cpu_bytes_to_use",
    ),
    (
        {},
        [
            "--kv-offloading-size",
            "1",
            "--kv-transfer-config",
            '{"kv_connector": "RecordingConnector", "kv_role": "kv_both"}',
        ],
        2,
        "give it or --kv-transfer-config, not both",
    ),
    (
        {},
        ["--kv-events-config", '{"enable_kv_cache_events": true, "hwm": -1}'],
        2,
        "kv_events_config.hwm must be an integer of 0 or more",
    ),
    (
        {},
        [
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
            "--pipeline-parallel-size",
            "2",
        ],
        2,
        "speculative decoding across pipeline stages is planned",
    ),
    # the engine's rule, against the model's 2 layers: only `resolve_config` knows them
    (
        {"VLLM_PP_LAYER_PARTITION": "1,1"},
        [],
        1,
        "VLLM_PP_LAYER_PARTITION=1,1 must give each of the 1 pipeline stages",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("env", "args", "status", "message"), REFUSED)
def test_config_exits_as_serve_does(model_factory, capsys, monkeypatch, env, args, status, message):
    path = model_factory("LlamaForCausalLM")
    served_status, served_err = serve_exit([path, *args], env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, line, _ = config_exit([path, *args], capsys)
    assert (code, served_status) == (status, status)
    assert message in line and message in served_err


MALFORMED = {"int": "abc", "float": "abc", "bool": "maybe"}
TYPED = [
    var
    for var in ENV_VARS
    if var.name.startswith("VLLM_") and (var.kind in MALFORMED or var.choices)
]


@pytest.mark.parametrize("var", TYPED, ids=[var.name for var in TYPED])
def test_every_malformed_env_value_is_refused_before_anything_starts(var):
    """The check `serve` and `config` both make first reads every VLLM_* value as the runtime
    will, so a malformed one fails there, with the message the runtime would give."""
    environ = {var.name: MALFORMED.get(var.kind, "not-a-choice")}
    with pytest.raises(ValueError) as expected:
        read_env(var.name, environ)
    with pytest.raises(ValueError) as raised:
        check_settings(build_config("org/model"), environ)
    assert str(raised.value) == str(expected.value)
