"""Graceful shutdown with a deadline (--shutdown-timeout): on SIGTERM the server refuses new
requests and /health with 503, lets in-flight requests finish for at most the timeout, aborts the
rest through the engine (a stream ends with finish_reason "abort" and [DONE], not a cut
connection), stops the engine core and exits 0."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from infernetes.runtime.server.shutdown import Drain
from infernetes.runtime.server.sse_reader import sse_lines

# A context long enough that a stream outlasts the drain by far (the tiny model writes a few
# hundred tokens a second on a CPU).
LONG_CONTEXT = 16384
SHUTDOWN_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    from infernetes.runtime.testing import make_tiny_llama

    return make_tiny_llama(
        tmp_path_factory.mktemp("long-llama"), max_position_embeddings=LONG_CONTEXT
    )


def start(factory, model, extra: list[str], log_name: str):
    server = factory(
        [
            str(model),
            "--max-model-len",
            str(LONG_CONTEXT),
            "--num-gpu-blocks-override",
            "1100",
            *extra,
        ],
        log_name=log_name,
    )
    server.wait_ready()
    return server


def stream_body(model, max_tokens: int) -> dict:
    return {
        "model": str(model),
        "prompt": "Drain",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def data_lines(lines) -> list[str]:
    return [line[6:] for line in lines if line.startswith("data: ")]


def engine_children(server) -> list[psutil.Process]:
    children = psutil.Process(server.process.pid).children(recursive=True)
    assert children, "the engine core runs in a child process"
    return children


def assert_clean_exit(server, children: list[psutil.Process]) -> None:
    assert server.process.wait(30) == 0, server.tail()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {alive}"


def wait_running(server, count: int) -> None:
    """Until the engine reports ``count`` requests running (its gauge follows each step)."""
    for _ in range(300):
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        found = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.MULTILINE)
        if found and float(found.group(1)) == count:
            return
        time.sleep(0.1)
    raise AssertionError(f"never {count} requests running")


def test_sigterm_aborts_what_outlasts_the_timeout(server_process_factory, long_context_model):
    server = start(
        server_process_factory,
        long_context_model,
        ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
        "shutdown-deadline.log",
    )
    try:
        body = stream_body(long_context_model, LONG_CONTEXT - 16)
        whole_body = {**body, "stream": False, "stream_options": None}
        with (
            httpx.Client(timeout=60) as http,
            ThreadPoolExecutor(1) as pool,
            http.stream("POST", f"{server.url}/v1/completions", json=body) as response,
        ):
            lines = sse_lines(response.iter_text())
            first = next(line for line in lines if line.startswith("data: {"))
            assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
            whole = pool.submit(
                httpx.post, f"{server.url}/v1/completions", json=whole_body, timeout=60
            )
            wait_running(server, 2)
            children = engine_children(server)
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = httpx.post(
                f"{server.url}/v1/completions",
                timeout=10,
                json={"model": str(long_context_model), "prompt": "late", "max_tokens": 2},
            )
            health = httpx.get(f"{server.url}/health", timeout=10)
            rest = data_lines(lines)
            ended_after = time.monotonic() - signalled
        assert refused.status_code == 503
        assert (
            refused.json()["error"]["code"] == 503
            and "shutting down" in refused.json()["error"]["message"]
        )
        assert refused.headers["connection"] == "close"
        assert health.status_code == 503
        assert rest[-1] == "[DONE]"
        events = [json.loads(item) for item in rest[:-1]]
        reasons = [event["choices"][0]["finish_reason"] for event in events if event["choices"]]
        assert reasons[-1] == "abort" and set(reasons[:-1]) <= {None}
        assert events[-1]["usage"]["completion_tokens"] < LONG_CONTEXT - 16
        assert SHUTDOWN_TIMEOUT_S - 0.1 <= ended_after < SHUTDOWN_TIMEOUT_S + 8
        # A whole (non-streamed) response is cut short the same way, with its text so far.
        cut = whole.result()
        assert cut.status_code == 200 and cut.json()["choices"][0]["finish_reason"] == "abort"
        assert_clean_exit(server, children)
        log = server.tail()
        assert "SIGTERM: draining 2 request(s) in flight for at most 2 s" in log
        assert "0 request(s) finished, 2 aborted" in log
    finally:
        server.stop()


def test_sigterm_lets_a_short_request_finish(server_process_factory, long_context_model):
    """With the default timeout: the stream in flight ends normally, and the drain ends with it
    (the server does not wait out the timeout)."""
    server = start(server_process_factory, long_context_model, [], "shutdown-short.log")
    try:
        body = stream_body(long_context_model, 40)
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", f"{server.url}/v1/completions", json=body) as response,
        ):
            lines = sse_lines(response.iter_text())
            next(line for line in lines if line.startswith("data: {"))
            children = engine_children(server)
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            rest = data_lines(lines)
        assert rest[-1] == "[DONE]"
        events = [json.loads(item) for item in rest[:-1]]
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
        assert events[-1]["usage"]["completion_tokens"] == 40
        assert_clean_exit(server, children)
        assert time.monotonic() - signalled < 20  # well inside the default 30 s
        assert "1 request(s) finished, 0 aborted" in server.tail()
    finally:
        server.stop()


class FakeEngine:
    """Records aborts; the requests it holds end when aborted."""

    def __init__(self, drain: Drain, ids: list[str]) -> None:
        self.drain = drain
        self.ids = list(ids)
        self.aborted: list[str] = []

    def request_ids(self) -> list[str]:
        return list(self.ids)

    async def abort(self, ids: list[str]) -> None:
        self.aborted += ids
        for _ in ids:
            self.drain.leave()
        self.ids = [i for i in self.ids if i not in ids]


def test_drain_waits_for_the_timeout_then_aborts():
    async def scenario() -> tuple[float, list[str]]:
        drain = Drain(0.3)
        drain.enter()
        drain.enter()
        engine = FakeEngine(drain, ["a", "b"])
        began = time.monotonic()
        await drain.drain(engine)
        return time.monotonic() - began, engine.aborted

    took, aborted = asyncio.run(scenario())
    assert aborted == ["a", "b"]
    assert 0.3 <= took < 1.5


def test_drain_ends_when_the_last_request_does():
    async def scenario() -> tuple[float, list[str]]:
        drain = Drain(30)
        drain.enter()
        engine = FakeEngine(drain, ["a"])
        asyncio.get_running_loop().call_later(0.1, drain.leave)
        began = time.monotonic()
        await drain.drain(engine)
        assert drain.draining
        return time.monotonic() - began, engine.aborted

    took, aborted = asyncio.run(scenario())
    assert aborted == [] and took < 1.5
