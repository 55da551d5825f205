"""Server-wide stream settings: --enable-force-include-usage (every stream ends with a usage
chunk, whatever stream_options say; continuous usage still only where the request asks for it) and
--sse-keep-alive-interval (a comment whenever a stream was silent that long)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.server.api_server import build_app
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.sse_reader import sse_lines
from infernetes.runtime.server.state import ServerState

from infernetes.schema.config import build_config


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = AsyncEngine.from_config(build_config(str(tiny_llama_dir), max_model_len=256, seed=0))
    yield engine
    asyncio.run(engine.shutdown())


async def _chunks(engine, forced: bool, path: str, body: dict) -> list[dict]:
    config = build_config("tiny", enable_force_include_usage=forced)
    state = ServerState(FrontendSettings.from_config(config, environ={}))
    state.attach_engine(engine)
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        body = {"model": "tiny", "max_tokens": 3, "temperature": 0, "stream": True, **body}
        response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in sse_lines([response.text]) if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Paged attention"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
async def test_forced_usage_ends_every_stream(engine, path, body):
    plain = await _chunks(engine, False, path, body)
    assert all(chunk.get("usage") is None for chunk in plain)
    forced = await _chunks(engine, True, path, body)
    assert forced[-1]["choices"] == [] and forced[-1]["usage"]["completion_tokens"] == 3
    assert all(chunk.get("usage") is None for chunk in forced[:-1])  # not continuous
    asked = {**body, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    continuous = await _chunks(engine, True, path, asked)
    assert all(chunk.get("usage") is not None for chunk in continuous)


async def test_keep_alive_comments_fill_the_silences_of_a_stream():
    from infernetes.runtime.server.streaming import KEEP_ALIVE, keep_alive

    closed = []

    async def slow():
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(0.25)
            yield b"data: 2\n\n"
        finally:
            closed.append(True)

    events = [e async for e in keep_alive(slow(), 0.05)]
    assert events[0] == b"data: 1\n\n" and events[-1] == b"data: 2\n\n"
    assert 2 <= events.count(KEEP_ALIVE) == len(events) - 2
    assert closed == [True]
    assert [e async for e in keep_alive(slow(), 0)] == [b"data: 1\n\n", b"data: 2\n\n"]
    # a client that goes away mid-stream closes the source (the engine request is aborted)
    stream = keep_alive(slow(), 0.05)
    assert await anext(stream) == b"data: 1\n\n"
    await stream.aclose()
    assert closed == [True, True, True]


async def test_sse_keep_alive_interval_reaches_the_routes(engine, monkeypatch):
    from infernetes.runtime.server import routes, streaming

    intervals = []

    def recording(events, interval):
        intervals.append(interval)
        return streaming.keep_alive(events, interval)

    monkeypatch.setattr(routes, "keep_alive", recording)
    config = build_config("tiny", sse_keep_alive_interval=15)
    state = ServerState(FrontendSettings.from_config(config, environ={}))
    state.attach_engine(engine)
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        body = {"model": "tiny", "prompt": "Paged", "max_tokens": 3, "stream": True}
        response = await http.post("/v1/completions", json=body)
    assert response.text.rstrip().endswith("data: [DONE]")
    assert intervals == [15]
