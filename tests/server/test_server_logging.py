"""The VLLM_* logging variables in both server processes: VLLM_CONFIGURE_LOGGING,
VLLM_LOGGING_LEVEL, VLLM_LOGGING_PREFIX and VLLM_LOGGING_CONFIG_PATH."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest
from infernetes.runtime.logging_config import LoggingSettings, configure_logging


@pytest.fixture
def restored_logging():
    """Puts the root and ``infernetes`` loggers back as they were (pytest's handlers live there)."""
    root, ours = logging.getLogger(), logging.getLogger("infernetes")
    saved = (list(root.handlers), root.level, ours.level, ours.propagate)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    ours.setLevel(saved[2])
    ours.propagate = saved[3]


def test_defaults_configure_info_without_prefix():
    settings = LoggingSettings.from_env({})
    assert settings == LoggingSettings(configure=True, level="INFO", prefix="", config_path=None)


def test_level_and_prefix_shape_every_line(restored_logging, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    settings = LoggingSettings.from_env(
        {"VLLM_LOGGING_LEVEL": "debug", "VLLM_LOGGING_PREFIX": "[pod-a] "}
    )
    configure_logging(settings, tag="core pid 7")
    logging.getLogger("infernetes.runtime.engine").debug("step %d", 1)
    logging.getLogger("somelibrary").info("library chatter stays out")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("[pod-a] DEBUG ")
    assert lines[0].endswith("[core pid 7] infernetes.runtime.engine: step 1")


def test_warning_level_hides_info(restored_logging, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging(LoggingSettings.from_env({"VLLM_LOGGING_LEVEL": "WARNING"}))
    configure_logging(
        LoggingSettings.from_env({"VLLM_LOGGING_LEVEL": "WARNING"})
    )  # again: one handler
    logging.getLogger("infernetes.x").info("hidden")
    logging.getLogger("infernetes.x").warning("shown")
    assert stream.getvalue().count("shown") == 1
    assert "hidden" not in stream.getvalue()


def test_configure_logging_0_leaves_logging_alone(restored_logging):
    before = (list(logging.getLogger().handlers), logging.getLogger("infernetes").level)
    configure_logging(
        LoggingSettings.from_env({"VLLM_CONFIGURE_LOGGING": "0", "VLLM_LOGGING_LEVEL": "DEBUG"})
    )
    assert (list(logging.getLogger().handlers), logging.getLogger("infernetes").level) == before


def test_config_path_is_applied_as_dict_config(restored_logging, tmp_path):
    path = tmp_path / "logging.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "loggers": {"infernetes": {"level": "ERROR"}},
            }
        )
    )
    settings = LoggingSettings.from_env({"VLLM_LOGGING_CONFIG_PATH": str(path)})
    configure_logging(settings)
    assert logging.getLogger("infernetes").level == logging.ERROR


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"VLLM_LOGGING_CONFIG_PATH": "/nonexistent/logging.json"},
            "VLLM_LOGGING_CONFIG_PATH=/nonexistent/logging.json: no such file",
        ),
        (
            {"VLLM_LOGGING_CONFIG_PATH": "{here}", "VLLM_CONFIGURE_LOGGING": "0"},
            "VLLM_CONFIGURE_LOGGING=0",
        ),
        ({"VLLM_LOGGING_CONFIG_PATH": "{list}"}, "expected a JSON object"),
        ({"VLLM_LOGGING_LEVEL": "LOUD"}, "VLLM_LOGGING_LEVEL"),
    ],
)
def test_bad_logging_variables_are_errors_naming_them(tmp_path, environ, message):
    here = tmp_path / "config.json"
    here.write_text("{}")
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    environ = {k: v.format(here=here, list=listed) for k, v in environ.items()}
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        LoggingSettings.from_env(environ)


def test_serve_exits_2_on_a_missing_logging_config(tiny_llama_dir, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "infernetes.cli.main", "serve", str(tiny_llama_dir)],
        env={**os.environ, "VLLM_LOGGING_CONFIG_PATH": str(tmp_path / "missing.json")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "VLLM_LOGGING_CONFIG_PATH" in result.stderr and "no such file" in result.stderr


def _started_and_stopped(server_process_factory, args, env, log_name) -> list[str]:
    """The log lines of a server started with ``args`` and ``env`` until ready, then stopped."""
    with server_process_factory(
        [*args, "--max-model-len", "128", "--num-gpu-blocks-override", "16"],
        env={**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        log_name=log_name,
    ) as server:
        pass
    return server.log_path.read_text(errors="replace").splitlines()


def _core_logged_at_debug(lines: list[str]) -> bool:
    core = [line for line in lines if "[core pid " in line]
    return any("DEBUG" in line and "engine core process started" in line for line in core)


def test_prefix_and_level_reach_the_engine_core_process(tiny_llama_dir, server_process_factory):
    lines = _started_and_stopped(
        server_process_factory,
        [str(tiny_llama_dir)],
        {"VLLM_LOGGING_PREFIX": "<<pfx>> ", "VLLM_LOGGING_LEVEL": "DEBUG"},
        "logging-prefix.log",
    )
    assert _core_logged_at_debug(lines), lines
    ours = [line for line in lines if " infernetes." in line]
    assert ours and all(line.startswith("<<pfx>> ") for line in ours), ours


def test_log_level_flag_wins_over_the_variable_in_every_process(
    tiny_llama_dir, server_process_factory
):
    lines = _started_and_stopped(
        server_process_factory,
        [str(tiny_llama_dir), "--log-level", "DEBUG"],
        {"VLLM_LOGGING_LEVEL": "ERROR"},
        "logging-flag.log",
    )
    assert _core_logged_at_debug(lines), lines
