"""The app's frontend behaviour in-process (no model needed): probes while loading and after the
engine died, auth, body limits, docs, root path, user middleware, and refused settings."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from infernetes.runtime.preflight import check_frontend_settings
from infernetes.runtime.server.api_server import (
    _watch_engine,
    build_app,
    run_server,
)
from infernetes.runtime.server.middleware import RequestBodyMiddleware
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.state import ServerState

from infernetes.schema.config import build_config
from infernetes.schema.parser import parse_serve_args


def client_for(settings: FrontendSettings, engine=None) -> httpx.AsyncClient:
    state = ServerState(settings)
    app = build_app(state)
    state.engine = engine
    # uvicorn passes --root-path in the ASGI scope; the transport does the same here.
    transport = httpx.ASGITransport(app=app, root_path=settings.root_path or "")
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_loading_answers_503_and_health_fails():
    async with client_for(FrontendSettings()) as client:
        assert (await client.get("/health")).status_code == 503
        response = await client.post("/v1/completions", json={"prompt": "x"})
        assert response.status_code == 503
        assert "loading" in response.json()["error"]["message"]
        # clients that wait for /v1/models before sending must wait for the engine
        assert (await client.get("/v1/models")).status_code == 503
        assert (await client.get("/version")).status_code == 200


async def test_dead_engine_fails_health_and_requests():
    dead = SimpleNamespace(errored=True, dead_error=RuntimeError("boom"), max_model_len=16)
    async with client_for(FrontendSettings(), engine=dead) as client:
        assert (await client.get("/health")).status_code == 503
        response = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert response.status_code == 503 and "boom" in response.json()["error"]["message"]


@pytest.mark.parametrize(("keep_alive", "exits"), [(False, True), (True, False)])
async def test_engine_death_stops_the_server_unless_kept_alive(monkeypatch, keep_alive, exits):
    monkeypatch.setattr("infernetes.runtime.server.api_server.ENGINE_WATCH_INTERVAL_S", 0.01)
    state = ServerState(FrontendSettings(keep_alive_on_engine_death=keep_alive))
    state.engine = SimpleNamespace(errored=True, dead_error="boom")
    app = FastAPI()
    app.state.uvicorn_server = SimpleNamespace(should_exit=False)
    watcher = asyncio.create_task(_watch_engine(app, state))
    await asyncio.sleep(0.1)
    watcher.cancel()
    assert app.state.uvicorn_server.should_exit is exits


async def test_api_key_from_flag_or_environment():
    settings = FrontendSettings.from_config(
        SimpleNamespace(api_key=None), environ={"VLLM_API_KEY": "env-key"}
    )
    assert settings.api_keys == ("env-key",)
    async with client_for(settings) as client:
        assert (await client.get("/v1/models")).status_code == 401
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
        assert (
            await client.get("/v1/models", headers={"Authorization": "Bearer env-key"})
        ).status_code == 503  # past the key: the model is still loading
        assert (await client.get("/health")).status_code == 503  # open, just not ready
        assert (await client.get("/metrics")).status_code == 200
    # vLLM 0.33 takes several keys: --api-key k1 k2 (any one of them is let in)
    config = parse_serve_args(["m", "--api-key", "k1", "k2"])
    settings = FrontendSettings.from_config(config, environ={})
    assert settings.api_keys == ("k1", "k2")
    async with client_for(settings) as client:
        for key in ("k1", "k2"):
            response = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert response.status_code == 503


async def test_body_size_limit_answers_413():
    async def echo(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    app = RequestBodyMiddleware(echo, max_bytes=10)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        assert (await client.post("/", content=b"small")).status_code == 200
        big = await client.post("/", content=b"x" * 100)
        assert big.status_code == 413 and "100 bytes" in big.json()["error"]["message"]

        async def chunks():  # no Content-Length: counted as it arrives
            for _ in range(5):
                yield b"xxxxx"

        assert (await client.post("/", content=chunks())).status_code == 413


async def test_a_stalled_body_gets_408_before_the_app_runs():
    called = []

    async def app(scope, receive, send):
        called.append(scope["path"])

    async def stalled_receive():
        await asyncio.sleep(3600)

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    await RequestBodyMiddleware(app, timeout_s=0.05)(scope, stalled_receive, send)
    assert not called
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"did not arrive" in sent[1]["body"]


async def test_docs_toggle_and_root_path():
    async with client_for(FrontendSettings(disable_fastapi_docs=True)) as client:
        assert (await client.get("/openapi.json")).status_code == 404
        assert (await client.get("/docs")).status_code == 404
    async with client_for(FrontendSettings(root_path="/llm")) as client:
        spec = (await client.get("/llm/openapi.json")).json()
        assert spec["servers"] == [{"url": "/llm"}]
        assert "/v1/completions" in spec["paths"]
        assert (await client.get("/llm/version")).status_code == 200


async def test_user_middleware_is_installed():
    settings = FrontendSettings(middleware=("starlette.middleware.gzip.GZipMiddleware",))
    async with client_for(settings) as client:
        response = await client.get("/openapi.json", headers={"Accept-Encoding": "gzip"})
        assert response.headers["content-encoding"] == "gzip"
    with pytest.raises(ValueError, match="no attribute"):
        client_for(FrontendSettings(middleware=("starlette.middleware.gzip.Nope",)))


def test_refused_settings_name_the_flag():
    with pytest.raises(ValueError, match=r"--tool-call-parser 'ernie45' is unknown; supported: .*hermes"):
        check_frontend_settings(FrontendSettings(tool_call_parser="ernie45"))
    with pytest.raises(ValueError, match="--tool-call-parser"):
        check_frontend_settings(FrontendSettings(enable_auto_tool_choice=True))
    with pytest.raises(ValueError, match="outlines"):
        check_frontend_settings(FrontendSettings(guided_decoding_backend="outlines"))
    with pytest.raises(ValueError, match="no such file"):
        check_frontend_settings(FrontendSettings(chat_template="missing.jinja"))


def test_run_server_exits_2_on_a_refused_frontend_setting(capsys):
    config = build_config("some/model", chat_template="missing.jinja")
    with pytest.raises(SystemExit) as info:
        run_server(config)
    assert info.value.code == 2
    assert "missing.jinja" in capsys.readouterr().err
