"""A hung engine-core process fails /health and stops the server instead of hanging it: a stopped
core (SIGSTOP) with a request in flight trips VLLM_ENGINE_ITERATION_TIMEOUT_S, and an unanswered
maintenance call trips VLLM_RPC_TIMEOUT. A hung core is killed at once, not waited for."""

from __future__ import annotations

import contextlib
import signal
import time

import httpx
import psutil
import pytest

ARGS = [
    "--max-model-len",
    "256",
    "--num-gpu-blocks-override",
    "32",
    "--served-model-name",
    "tiny",
]


@pytest.fixture
def hung_core(tiny_llama_dir, server_process_factory):
    """``start(env, log_name) -> (server, core)``; the core is killed afterwards whatever happened."""
    started = []

    def start(env: dict[str, str], log_name: str):
        server = server_process_factory([str(tiny_llama_dir), *ARGS], env=env, log_name=log_name)
        started.append(server)
        server.wait_ready()
        children = psutil.Process(server.process.pid).children()
        core = next(c for c in children if "spawn_main" in " ".join(c.cmdline()))
        started.append(core)
        return server, core

    yield start
    for item in reversed(started):
        with contextlib.suppress(psutil.Error):
            item.kill() if isinstance(item, psutil.Process) else item.stop()


def _exits(server, timeout: float = 60) -> int | None:
    with contextlib.suppress(Exception):
        return server.process.wait(timeout)
    return None


def test_a_stuck_step_fails_the_server(hung_core):
    server, core = hung_core({"VLLM_ENGINE_ITERATION_TIMEOUT_S": "2"}, "iteration-timeout.log")
    body = {
        "model": "tiny",
        "prompt": "Hello",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        core.send_signal(signal.SIGSTOP)  # the step in progress never ends
        started = time.monotonic()
        rest = "\n".join(lines)
    assert "[DONE]" not in rest or "error" in rest
    assert time.monotonic() - started < 10
    assert _exits(server) == 1, server.tail()
    assert "VLLM_ENGINE_ITERATION_TIMEOUT_S=2" in server.tail()
    assert "killing the hung engine core process" in server.tail()  # not waited for


def test_an_unanswered_maintenance_call_fails_health(hung_core):
    env = {
        "VLLM_RPC_TIMEOUT": "1000",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1",
    }
    server, core = hung_core(env, "rpc-timeout.log")
    core.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    response = httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
    assert response.status_code == 503
    assert "VLLM_RPC_TIMEOUT=1000 ms" in response.json()["error"]["message"]
    assert time.monotonic() - started < 5
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 503
