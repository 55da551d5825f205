"""--max-concurrency: at most N requests in flight on the inference routes, the next one gets an
OpenAI-style 429, and every way a request ends (finished, failed, cut by its client) gives its
slot back. Unit tests pin the middleware down on a fake ASGI app; the server test proves it on a
real server with real streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest
from infernetes.runtime.server.middleware import ConcurrencyLimitMiddleware
from infernetes.runtime.server.sse_reader import asse_lines

LIMIT = 2
LONG_STREAM_TOKENS = 4000  # far longer than the checks made while the stream is open (seconds)
ADMIT_DEADLINE_S = 60


# ---------------------------------------------------------------- the middleware alone


def _scope(path: str = "/v1/completions", method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}


class _Sent:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def __call__(self, message: dict) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def body(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.messages[1:]))


async def _receive() -> dict:
    return {"type": "http.request", "body": b""}


async def test_middleware_refuses_the_request_over_the_limit_with_openai_json():
    gate = asyncio.Event()

    async def slow_app(scope, receive, send):
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    limited = ConcurrencyLimitMiddleware(slow_app, limit=LIMIT)
    first = [_Sent() for _ in range(LIMIT)]
    tasks = [asyncio.create_task(limited(_scope(), _receive, s)) for s in first]
    await asyncio.sleep(0)
    assert limited.in_flight == LIMIT

    refused = _Sent()
    await limited(_scope("/v1/chat/completions"), _receive, refused)
    assert refused.status == 429
    error = refused.body["error"]
    assert error["type"] == "TooManyRequests"
    assert error["code"] == 429
    assert f"--max-concurrency {LIMIT}" in error["message"]

    gate.set()
    await asyncio.gather(*tasks)
    assert [s.status for s in first] == [200] * LIMIT
    assert limited.in_flight == 0


async def test_middleware_releases_on_errors_and_cancellation():
    async def failing_app(scope, receive, send):
        raise RuntimeError("boom")

    limited = ConcurrencyLimitMiddleware(failing_app, limit=1)
    with pytest.raises(RuntimeError):
        await limited(_scope(), _receive, _Sent())
    assert limited.in_flight == 0

    async def hanging_app(scope, receive, send):
        await asyncio.Event().wait()

    limited = ConcurrencyLimitMiddleware(hanging_app, limit=1)
    task = asyncio.create_task(limited(_scope(), _receive, _Sent()))
    await asyncio.sleep(0)
    assert limited.in_flight == 1
    task.cancel()  # what a client disconnect does to a streaming response
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert limited.in_flight == 0


async def test_middleware_leaves_other_routes_alone():
    async def ok_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    limited = ConcurrencyLimitMiddleware(ok_app, limit=1)
    limited.in_flight = 1  # full
    for scope in (
        _scope("/v1/models", "GET"),
        _scope("/health", "GET"),
        _scope("/tokenize"),
        _scope("/v1/completions", "OPTIONS"),
    ):
        sent = _Sent()
        await limited(scope, _receive, sent)
        assert sent.status == 200, scope


def test_middleware_rejects_a_limit_below_one():
    with pytest.raises(ValueError, match="--max-concurrency"):
        ConcurrencyLimitMiddleware(lambda *a: None, limit=0)


# ---------------------------------------------------------------- on a real server


@pytest.fixture(scope="module")
def limited_server(tiny_llama_dir, server_process_factory):
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--max-concurrency",
            str(LIMIT),
            "--max-model-len",
            "4096",
            "--disable-uvicorn-access-log",
            "--disable-log-stats",
        ],
        # Past the tiny model's 512 positions, so a stream outlasts the checks made during it.
        env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
        log_name="limited-server.log",
    ) as server:
        yield server


def _stream_body(model: str, index: int, max_tokens: int = LONG_STREAM_TOKENS) -> dict:
    return {
        "model": model,
        "prompt": f"Slow {index}",
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


async def _until_admitted(send) -> httpx.Response:
    """A slot frees once the server has seen the end of a request, which can be a moment after
    the client has: retry a 429 until the deadline."""
    deadline = time.monotonic() + ADMIT_DEADLINE_S
    while True:
        response = await send()
        if response.status_code != 429 or time.monotonic() > deadline:
            return response
        await response.aclose()
        await asyncio.sleep(0.05)


async def _open_stream(
    stack: contextlib.AsyncExitStack, client: httpx.AsyncClient, body: dict
) -> httpx.Response:
    """Opens a stream and reads its first event: from then on the request is in flight."""
    response = await _until_admitted(
        lambda: stack.enter_async_context(client.stream("POST", "/v1/completions", json=body))
    )
    assert response.status_code == 200, await response.aread()
    lines = asse_lines(response.aiter_text())
    async for line in lines:
        if line.startswith("data: "):
            break
    response.lines = lines
    return response


async def _refused(client: httpx.AsyncClient, path: str, body: dict) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 429, (path, response.text)
    error = response.json()["error"]
    assert error["type"] == "TooManyRequests"
    assert f"--max-concurrency {LIMIT}" in error["message"]


async def test_server_admits_n_streams_refuses_the_next_and_frees_slots(limited_server):
    model = httpx.get(f"{limited_server.url}/v1/models").json()["data"][0]["id"]
    short = {"model": model, "prompt": "Hi", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=limited_server.url, timeout=120) as client:
        async with contextlib.AsyncExitStack() as open_streams:
            streams = [
                await _open_stream(open_streams, client, _stream_body(model, i))
                for i in range(LIMIT)
            ]

            # Full: every inference route refuses at once, with OpenAI error JSON.
            await _refused(client, "/v1/completions", short)
            await _refused(
                client,
                "/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": "Hi"}]},
            )
            await _refused(client, "/v1/embeddings", {"model": model, "input": "Hi"})
            # Other routes are not limited.
            assert (await client.get("/v1/models")).status_code == 200
            tokenized = await client.post("/tokenize", json={"model": model, "prompt": "Hi"})
            assert tokenized.status_code == 200

            # Cutting one stream (client disconnect) frees its slot while the other still runs:
            # a new long stream gets it, and the server is full again.
            await streams[0].aclose()
            await _open_stream(open_streams, client, _stream_body(model, LIMIT))
            await _refused(client, "/v1/completions", short)
        # Leaving the block cut the other streams too.

        # Failed requests give their slots back: too long, unknown model, bad field.
        for bad in (
            {"model": model, "prompt": "x", "max_tokens": 9000},
            {"model": "nope", "prompt": "x"},
            {"model": model, "prompt": "x", "temperature": "hot"},
        ):
            response = await _until_admitted(
                lambda bad=bad: client.post("/v1/completions", json=bad)
            )
            assert response.status_code in (400, 404, 422), response.text

        # Streams that finish on their own give their slots back: N at once, then N again.
        for _ in range(2):
            async with contextlib.AsyncExitStack() as stack:
                finishing = [
                    await _open_stream(stack, client, _stream_body(model, i, max_tokens=3))
                    for i in range(LIMIT)
                ]
                for stream in finishing:
                    assert "data: [DONE]" in [line async for line in stream.lines]
        admitted = await _until_admitted(lambda: client.post("/v1/completions", json=short))
        assert admitted.status_code == 200, admitted.text
        assert admitted.json()["usage"]["completion_tokens"] == 2
