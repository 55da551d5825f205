"""A hostile or careless client cannot take the server down: each request shape that once killed,
froze or 500'd the server gets a 4xx, the probes stay fast while heavy requests are prepared,
stalled connections hold no concurrency slot, and the server then serves a normal request."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from infernetes.runtime.server.api_server import build_app
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.state import ServerState

STALL_TIMEOUT_S = 2
GUARDED_ARGS = [
    "--served-model-name",
    "tiny",
    "--max-model-len",
    "256",
    "--num-gpu-blocks-override",
    "48",
    "--max-concurrency",
    "2",
    "--trust-request-chat-template",
    "--disable-uvicorn-access-log",
    "--seed",
    "0",
]


@pytest.fixture(scope="module")
def guarded_server(tiny_llama_dir, server_process_factory):
    with server_process_factory(
        [str(tiny_llama_dir), *GUARDED_ARGS],
        log_name="guarded-server.log",
        env={
            "INFERNETES_HTTP_BODY_TIMEOUT_S": str(STALL_TIMEOUT_S),
            "INFERNETES_HTTP_HEADER_TIMEOUT_S": str(STALL_TIMEOUT_S),
        },
    ) as server:
        yield server


@pytest.fixture(scope="module")
def http(guarded_server):
    with httpx.Client(base_url=guarded_server.url, timeout=120) as client:
        yield client


def _serves_normally(http: httpx.Client) -> None:
    response = http.post(
        "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 3}
    )
    assert response.status_code == 200, response.text
    assert http.get("/health").status_code == 200


def _raw_post(http: httpx.Client, path: str, body: str) -> httpx.Response:
    return http.post(
        path,
        content=body.encode("utf-8", "surrogatepass"),
        headers={"content-type": "application/json"},
    )


COMPLETION = '{"model": "tiny", "prompt": "Hi", "max_tokens": 4, "temperature": 0.8, %s}'
CHAT = '{"model": "tiny", "max_tokens": 4, "messages": %s}'
EVERY_TOKEN = json.dumps({str(t): -1e308 for t in range(500)})
HOSTILE = {
    "logit_bias NaN": ("/v1/completions", COMPLETION % '"logit_bias": {"5": NaN}', "logit_bias"),
    "logit_bias Infinity": (
        "/v1/completions",
        COMPLETION % '"logit_bias": {"5": Infinity}',
        "logit_bias",
    ),
    "logit_bias 1e308": (
        "/v1/completions",
        COMPLETION % '"logit_bias": {"5": 1e308}',
        "logit_bias",
    ),
    "logit_bias -1e308 everywhere": (
        "/v1/completions",
        COMPLETION % f'"logit_bias": {EVERY_TOKEN}',
        "logit_bias",
    ),
    "repetition_penalty 1e-300": (
        "/v1/completions",
        COMPLETION % '"repetition_penalty": 1e-300',
        "repetition_penalty",
    ),
    "empty prompt, repetition_penalty 5e-324": (
        "/v1/completions",
        '{"prompt": "", "repetition_penalty": 5e-324}',
        "repetition_penalty",
    ),
    "temperature NaN": ("/v1/completions", COMPLETION % '"temperature": NaN', "temperature"),
    "top_p Infinity": ("/v1/completions", COMPLETION % '"top_p": Infinity', "top_p"),
    "lone surrogate in chat": (
        "/v1/chat/completions",
        CHAT % '[{"role": "user", "content": "\\ud800"}]',
        "messages[0].content",
    ),
    "lone surrogate in completions": ("/v1/completions", '{"prompt": "a\\udfffb"}', "prompt"),
    "lone surrogate in /tokenize": ("/tokenize", '{"prompt": "\\ud800"}', "prompt"),
    "tool_calls function a string": (
        "/v1/chat/completions",
        CHAT
        % '[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"function": "x"}]}]',
        "tool_calls",
    ),
    "tool_calls not a list": (
        "/v1/chat/completions",
        CHAT % '[{"role": "assistant", "tool_calls": "call it"}]',
        "tool_calls",
    ),
    "template range(10**6)": (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
        '"chat_template": "{% for i in range(10**6) %}{% endfor %}"}',
        "chat_template",
    ),
    "nested 100000 deep": (
        "/v1/completions",
        '{"prompt": "x", "extra": ' + "[" * 100000 + "]" * 100000 + "}",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_request_gets_a_4xx_and_the_server_goes_on(http, name):
    path, body, mentioned = HOSTILE[name]
    response = _raw_post(http, path, body)
    assert 400 <= response.status_code < 500, (name, response.status_code, response.text[:300])
    error = response.json()["error"]
    if mentioned:
        assert mentioned in f"{error['message']} {error['param']}", error
    _serves_normally(http)


def test_405_names_the_allowed_methods_and_413_covers_chunked_bodies(http):
    response = http.get("/v1/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["error"]["code"] == 405

    def chunks():  # no Content-Length: the limit counts what arrives
        for _ in range(33):
            yield b" " * (1 << 20)

    assert http.post("/v1/completions", content=chunks()).status_code == 413
    _serves_normally(http)


class HealthProbe:
    """Polls /health from a thread; ``worst`` is the slowest answer seen."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self.answers = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                assert client.get(f"{self.url}/health").status_code == 200
                self.worst = max(self.worst, time.monotonic() - started)
                self.answers += 1
                time.sleep(0.05)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_health_stays_fast_while_heavy_requests_are_prepared(guarded_server, http):
    heavy = [
        (
            "/v1/completions",
            {"model": "tiny", "prompt": "hello world, it is a test. " * 370_000},
        ),  # 10 MB
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "chat_template": "{{ 'x' * 30000000 }}",
            },
        ),
        (
            "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "chat_template": "{% for i in range(100000) %}{% for j in range(100000) %}"
                "{% endfor %}{% endfor %}",
            },
        ),
    ]
    for path, body in heavy:
        with HealthProbe(guarded_server.url) as probe:
            started = time.monotonic()
            response = http.post(path, json=body)
            took = time.monotonic() - started
        assert response.status_code == 400, response.text[:300]
        # /health is never held up behind the heavy request (it would then take about as long
        # as the request does); a long request on a loaded machine may slow it past a second.
        assert probe.answers >= 3 and probe.worst < max(1.0, took / 4), (path, probe.worst, took)
    _serves_normally(http)


def test_stalled_clients_hold_no_concurrency_slot(guarded_server, http):
    host, port = "127.0.0.1", guarded_server.port
    stalled_bodies, stalled_headers = [], []
    for _ in range(8):  # more than --max-concurrency 2: each sent its headers, then stalls
        sock = socket.create_connection((host, port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"prompt": '
        )
        stalled_bodies.append(sock)
    for _ in range(4):  # these never finish their headers
        sock = socket.create_connection((host, port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        stalled_headers.append(sock)
    _serves_normally(http)  # not a 429: the stalled requests took no slot
    for sock in stalled_bodies:
        sock.settimeout(STALL_TIMEOUT_S + 10)
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    for sock in stalled_bodies + stalled_headers:
        sock.settimeout(STALL_TIMEOUT_S + 10)
        while sock.recv(4096):  # read to the end: the server closes the connection
            pass
        sock.close()
    _serves_normally(http)


# The OpenAPI document of the app (it needs no engine), driven against the running server.
SCHEMA = schemathesis.openapi.from_dict(build_app(ServerState(FrontendSettings())).openapi())
SCHEMA.config.generation.update(modes=list(schemathesis.GenerationMode))


# Fields that set how much work a valid request is: capped so the run stays bounded in time.
WORK_CAPS = {
    "max_tokens": 8,
    "max_completion_tokens": 8,
    "max_output_tokens": 8,
    "min_tokens": 8,
    "n": 2,
    "best_of": 2,
}


@SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_finds_no_server_error(case, guarded_server):
    if isinstance(case.body, dict):
        case.body.setdefault("max_tokens", WORK_CAPS["max_tokens"])
        if case.path == "/v1/responses":  # its length field has another name (else: the context)
            case.body.setdefault("max_output_tokens", WORK_CAPS["max_output_tokens"])
        for name, cap in WORK_CAPS.items():
            value = case.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                case.body[name] = cap
    response = case.call(base_url=guarded_server.url, timeout=60)
    assert response.status_code < 500, (case.path, response.status_code, response.text[:300])


def test_server_still_serves_after_all_that(http):
    _serves_normally(http)
