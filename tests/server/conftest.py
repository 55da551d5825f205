"""Real servers for the server tests: ``infernetes serve`` in a subprocess on a free loopback
port, over tiny models the engine's factory writes (random weights, a trained tokenizer)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

# The helper modules beside this file (ports, waits) import by name from the test modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ports import free_port

API_KEY = "sk-infernetes-test"
STARTUP_TIMEOUT_S = 180


class ServerProcess:
    """``infernetes serve <args>`` until stopped; ``url`` is its base URL."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        scheme: str = "http",
        log_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "infernetes.cli.main",
            "serve",
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self.log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, verify: bool | str = True) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2, verify=verify).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT_S}s: {self.tail()}")

    def __enter__(self) -> ServerProcess:
        """Ready to serve (stopped again if it never gets there)."""
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()
        return self.process.returncode


def _maps_torch(pid: int) -> bool:
    return any("libtorch" in m.path for m in psutil.Process(pid).memory_maps())


@pytest.fixture(scope="session")
def maps_torch():
    """``maps_torch(pid)``: whether the process has loaded torch's library. The API process never
    should: serving HTTP needs none of it, and importing it cost each server start seconds."""
    return _maps_torch


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    from infernetes.runtime.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


# The main test server: auth, two served names, hermes tools, compact JSON, CORS for one origin,
# dev routes, and a KV cache small enough that heavy load preempts.
MAIN_ARGS = [
    "--api-key",
    API_KEY,
    "--served-model-name",
    "tiny",
    "tiny-alias",
    "--max-model-len",
    "256",
    "--num-gpu-blocks-override",
    "48",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--guided-decoding-disable-any-whitespace",
    "--enable-prompt-tokens-details",
    "--enable-request-id-headers",
    "--enable-server-load-tracking",
    "--allowed-origins",
    '["http://allowed.example"]',
    "--disable-uvicorn-access-log",
    "--enable-sleep-mode",
    "--seed",
    "0",
]


@pytest.fixture(scope="session")
def server_process_factory(tmp_path_factory):
    """``start(args, env=None, scheme="http", log_name=...)`` -> a started ServerProcess."""
    logs = tmp_path_factory.mktemp("server-logs")

    def start(
        args: list[str],
        env: dict[str, str] | None = None,
        scheme: str = "http",
        log_name: str = "server.log",
    ) -> ServerProcess:
        return ServerProcess(args, env=env, scheme=scheme, log_path=logs / log_name)

    return start


@pytest.fixture(scope="session")
def main_server(tiny_llama_dir, server_process_factory):
    server = server_process_factory(
        [str(tiny_llama_dir), *MAIN_ARGS],
        env={"VLLM_SERVER_DEV_MODE": "1"},
        log_name="main-server.log",
    )
    server.api_key = API_KEY
    with server:
        yield server


@pytest.fixture
def auth_headers() -> dict[str, str]:
    """Headers carrying the main server's API key."""
    return {"Authorization": f"Bearer {API_KEY}"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Schemathesis (4.32, under pytest 9.2) gives the tests of all API operations one node id;
    pytest-xdist schedules by node id, so all operations but one would go untested there. The
    operation's label, as the id's parameters, makes each unique (and names it in reports)."""
    for item in items:
        label = getattr(item, "operation_label", None)
        node_id = getattr(item, "_id", None)  # pytest's structured node id (_pytest/nodeid.py)
        if label and node_id is not None and node_id.params is None:
            item._id = node_id.with_params(label)


@pytest.fixture(scope="session")
def harmony_vocab() -> Path:
    """The folder holding openai-harmony's vocabulary (for TIKTOKEN_ENCODINGS_BASE); skips the
    test when images/harmony-vocab.sh has not put it there."""
    from infernetes.runtime.testing import harmony_vocab_dir

    folder = harmony_vocab_dir()
    if folder is None:
        pytest.skip(
            "o200k_base.tiktoken is not in ~/.cache/infernetes/tiktoken: run images/harmony-vocab.sh"
        )
    return folder


@pytest.fixture
def harmony_env(harmony_vocab, monkeypatch) -> Path:
    """TIKTOKEN_ENCODINGS_BASE set to the vocabulary's folder for this test."""
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(harmony_vocab))
    return harmony_vocab
