"""Frontend flags reach what they configure: uvicorn (log level, TLS client certificates, logging
config, keep-alive), CORS, the chat template's content format and request logging."""

from __future__ import annotations

import json
import logging
import ssl
from types import SimpleNamespace

import httpx
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.server.api_server import build_app, uvicorn_config
from infernetes.runtime.server.chat_template import normalize_messages
from infernetes.runtime.server.protocol import ChatMessageIn
from infernetes.runtime.server.serving_base import ServingBase
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.state import ServerState

from infernetes.schema.config import build_config


def _settings(environ: dict | None = None, **flags) -> FrontendSettings:
    return FrontendSettings.from_config(build_config("some/model", **flags), environ=environ or {})


def test_uvicorn_gets_log_level_tls_logging_config_and_keep_alive(tmp_path):
    log_config = {"version": 1, "disable_existing_loggers": False}
    path = tmp_path / "logging.json"
    path.write_text(json.dumps(log_config))
    settings = _settings(
        {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "17"},
        uvicorn_log_level="debug",
        ssl_ca_certs="/certs/ca.pem",
        ssl_cert_reqs=ssl.CERT_REQUIRED,
        log_config_file=str(path),
    )
    config = uvicorn_config(build_app(ServerState(settings)), settings)
    assert config.log_level == "debug"
    assert (config.ssl_ca_certs, config.ssl_cert_reqs) == ("/certs/ca.pem", ssl.CERT_REQUIRED)
    assert config.log_config == log_config
    assert config.timeout_keep_alive == 17
    assert config.ssl_ciphers is None  # Python's default list unless --ssl-ciphers is given
    ciphers = _settings(ssl_ciphers="ECDHE+AESGCM")
    assert uvicorn_config(build_app(ServerState(ciphers)), ciphers).ssl_ciphers == "ECDHE+AESGCM"


async def test_cors_credentials_and_allowed_headers():
    settings = _settings(
        allowed_origins=["http://ui.example"], allow_credentials=True, allowed_headers=["x-tenant"]
    )
    transport = httpx.ASGITransport(app=build_app(ServerState(settings)))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        preflight = await client.options(
            "/v1/models",
            headers={
                "Origin": "http://ui.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "x-tenant",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-credentials"] == "true"
        assert "x-tenant" in preflight.headers["access-control-allow-headers"]
        refused = await client.options(
            "/v1/models",
            headers={
                "Origin": "http://ui.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "x-other",
            },
        )
        assert refused.status_code == 400


def test_chat_template_content_format_shapes_the_messages():
    messages = [ChatMessageIn(role="user", content=[{"type": "text", "text": "hi"}])]
    assert _settings(chat_template_content_format="openai").chat_template_content_format == "openai"
    assert normalize_messages(messages, "openai")[0]["content"] == [{"type": "text", "text": "hi"}]
    assert normalize_messages(messages, "string")[0]["content"] == "hi"


def _serving(**flags) -> ServingBase:
    engine = SimpleNamespace(
        tokenizer=[0] * 10, max_model_len=64, model_config=SimpleNamespace(vocab_size=10)
    )
    return ServingBase(engine, _settings(**flags))


def test_requests_are_not_logged_by_default(caplog):
    with caplog.at_level(logging.DEBUG, logger="infernetes.runtime.server"):
        _serving().log_request("r1", "secret prompt", [1, 2, 3], SamplingParams())
    assert not caplog.records


def test_enable_log_requests_logs_parameters_and_max_log_len_cuts_the_prompt(caplog):
    serving = _serving(enable_log_requests=True, max_log_len=5)
    with caplog.at_level(logging.INFO, logger="infernetes.runtime.server"):
        serving.log_request("r1", "abcdefghijklmnop", list(range(100, 120)), SamplingParams())
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["Received request r1"]
    assert "abcde" not in caplog.text  # the prompt is a DEBUG detail, as in vLLM
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="infernetes.runtime.server"):
        serving.log_request("r2", "abcdefghijklmnop", list(range(100, 120)), SamplingParams())
    assert "'abcde'" in caplog.text and "abcdef" not in caplog.text
    assert "[100, 101, 102, 103, 104]" in caplog.text and "105" not in caplog.text


def test_disable_log_requests_is_deprecated_and_changes_nothing(capsys):
    settings = _settings(disable_log_requests=True)
    assert settings.enable_log_requests is False


def test_probe_access_lines_are_quiet_while_the_model_loads_and_listed_paths_always():
    from infernetes.runtime.server.api_server import QuietAccessLines

    state = ServerState(_settings())
    quiet = QuietAccessLines(state)

    def line(path: str, status: int) -> logging.LogRecord:
        return logging.LogRecord(
            "uvicorn.access",
            logging.INFO,
            __file__,
            1,
            '%s - "%s %s HTTP/%s" %d',
            ("127.0.0.1:5", "GET", path, "1.1", status),
            None,
        )

    assert not quiet.filter(line("/health", 503)) and not quiet.filter(line("/ping", 503))
    assert quiet.filter(line("/v1/models", 503))
    state.engine = SimpleNamespace()  # loaded: every line is logged again
    assert quiet.filter(line("/health", 200))
    assert line("/metrics", 200).getMessage() == '127.0.0.1:5 - "GET /metrics HTTP/1.1" 200'

    listed = ServerState(_settings(disable_access_log_for_endpoints="/health, /metrics"))
    listed.engine = SimpleNamespace()
    quiet = QuietAccessLines(listed)
    assert not quiet.filter(line("/metrics", 200)) and not quiet.filter(line("/health?x=1", 200))
    assert quiet.filter(line("/v1/models", 200)) and quiet.filter(line("/metricsx", 200))


def test_stats_line_names_the_engines_device(caplog):
    from infernetes.runtime.engine.stats import SchedulerStats
    from infernetes.runtime.server.log_stats import LoggingStatLogger

    state = ServerState(_settings())
    stats_logger = LoggingStatLogger(interval_s=0.0)
    state.stat_fanout.loggers.append(stats_logger)
    engine = SimpleNamespace(
        tokenizer=[0] * 10,
        max_model_len=64,
        model_config=SimpleNamespace(vocab_size=10),
        device="cpu",
        is_pooling=False,
        cores=[None],  # one engine core
        media_placeholders=None,  # a text model
    )
    state.attach_engine(engine)
    with caplog.at_level(logging.INFO, logger="infernetes.runtime.server.stats"):
        stats_logger.record(
            SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.25), None
        )
    assert "CPU KV cache usage: 25.0%" in caplog.records[-1].getMessage()


def test_uds_serves_on_a_unix_socket_instead_of_host_and_port(tmp_path):
    import os
    import socket
    import stat
    import threading
    import time

    import uvicorn
    from infernetes.runtime.server.api_server import listen

    path = str(tmp_path / "api.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # an earlier run's socket file: replaced
    stale.close()
    settings = _settings(uds=path, port=1)  # the port is not used
    listener = listen(settings)
    assert listener.family == socket.AF_UNIX
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    server = uvicorn.Server(uvicorn_config(build_app(ServerState(settings)), settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://t") as client:
            assert client.get("/health").status_code == 503  # served; the model is not loaded
    finally:
        server.should_exit = True
        thread.join(20)
