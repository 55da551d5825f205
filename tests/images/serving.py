"""Starts a server command line and checks that it serves a tiny model: /health turns 200, a
completion comes back and the vllm:* metrics are exported. Shared by the tests that run the
server through the image's entrypoint and through the vLLM-named aliases."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time

import httpx

STARTUP_TIMEOUT_S = 240
# A small KV cache: on a CPU the default is 4 GiB, allocated zeroed.
SMALL_SERVER_ARGS = ["--max-model-len", "256", "--num-gpu-blocks-override", "32"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_serves(command: list[str], model: str, port: int, env: dict[str, str] | None = None):
    """Runs command (which must listen on 127.0.0.1:port and serve model) until it has answered,
    then stops it with SIGTERM."""
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a full pipe would block it
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            _check_answers(server, model, port, log)
        finally:
            server.terminate()
            server.wait(timeout=60)


def _check_answers(server: subprocess.Popen, model: str, port: int, log) -> None:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if server.poll() is not None:
            log.seek(0)
            raise AssertionError(f"the server exited {server.returncode}:\n{log.read()[-4000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{server.args} not healthy in {STARTUP_TIMEOUT_S} s"
        time.sleep(1)
    body = {"model": model, "prompt": "hello", "max_tokens": 5, "temperature": 0}
    completion = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
    assert completion["usage"]["completion_tokens"] == 5, completion
    assert "vllm:generation_tokens_total" in httpx.get(f"{base}/metrics", timeout=10).text
