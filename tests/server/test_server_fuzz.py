"""Hypothesis fuzzing of the real server: hundreds of malformed or odd requests, never a 5xx,
always OpenAI error JSON for a 4xx, and the server still answers a normal request afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
# Values of plausible types, so that many requests pass the schema and reach the semantic checks.
TYPED_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 600),
    st.floats(-3, 3),
    st.text(max_size=10),
    st.lists(st.text(max_size=5), max_size=3),
    st.lists(st.integers(-5, 600), max_size=4),
    st.just({"type": "json_object"}),
    st.just({"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}),
    st.just([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    st.just([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    st.just({"type": "function", "function": {"name": "missing"}}),
)
# Small or nonsensical values for the fields that decide how much work a request is.
WORK_LIMITS = st.one_of(st.integers(-3, 6), JSON_VALUES)

COMPLETION_FIELDS = [
    "model",
    "prompt",
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "seed",
    "logprobs",
    "echo",
    "stream",
    "stream_options",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "response_format",
    "prompt_logprobs",
    "truncate_prompt_tokens",
    "priority",
    "best_of",
    "suffix",
    "user",
    "skip_special_tokens",
]
CHAT_FIELDS = [f for f in COMPLETION_FIELDS if f not in ("prompt", "echo", "suffix", "best_of")] + [
    "messages",
    "tools",
    "tool_choice",
    "top_logprobs",
    "max_completion_tokens",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "parallel_tool_calls",
]

ENDPOINTS = {
    "/v1/completions": ({"model": "tiny", "prompt": "fuzz", "max_tokens": 2}, COMPLETION_FIELDS),
    "/v1/chat/completions": (
        {"model": "tiny", "messages": [{"role": "user", "content": "fuzz"}], "max_tokens": 2},
        CHAT_FIELDS,
    ),
    "/v1/embeddings": (
        {"model": "tiny", "input": "fuzz"},
        ["model", "input", "encoding_format", "dimensions"],
    ),
    "/tokenize": (
        {"model": "tiny", "prompt": "fuzz"},
        ["model", "prompt", "messages", "add_special_tokens"],
    ),
    "/detokenize": ({"model": "tiny", "tokens": [1, 2]}, ["model", "tokens"]),
}


@st.composite
def mutated_bodies(draw, values=JSON_VALUES):
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    base, fields = ENDPOINTS[path]
    body = dict(base)
    for name in draw(st.lists(st.sampled_from(fields), max_size=4, unique=True)):
        if draw(st.booleans()) and name in body:
            del body[name]
        else:
            limit = name in ("max_tokens", "n", "min_tokens", "max_completion_tokens", "best_of")
            body[name] = draw(WORK_LIMITS if limit else values)
    if isinstance(body.get("n"), int) and body["n"] > 4:
        body["n"] = 4
    return path, json.dumps(body).encode()


@st.composite
def raw_bodies(draw):
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    payload = draw(
        st.one_of(st.binary(max_size=64), JSON_VALUES.map(lambda v: json.dumps(v).encode()))
    )
    return path, payload


@pytest.fixture(scope="module")
def http(main_server):
    with httpx.Client(
        base_url=main_server.url,
        timeout=60,
        headers={"Authorization": f"Bearer {main_server.api_key}"},
    ) as client:
        yield client


def _check(
    http: httpx.Client, path: str, payload: bytes, content_type: str = "application/json"
) -> None:
    response = http.post(path, content=payload, headers={"Content-Type": content_type})
    assert response.status_code < 500, (path, payload, response.status_code, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["code"] == response.status_code


FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(case=mutated_bodies())
def test_mutated_requests_never_5xx(http, case):
    _check(http, *case)


@FUZZ
@given(case=mutated_bodies(TYPED_VALUES))
def test_well_typed_odd_requests_never_5xx(http, case):
    _check(http, *case)


@FUZZ
@given(case=raw_bodies(), content_type=st.sampled_from(["application/json", "text/plain", ""]))
def test_garbage_bodies_never_5xx(http, case, content_type):
    _check(http, *case, content_type=content_type)


def test_server_still_serves_after_fuzzing(http):
    response = http.post(
        "/v1/completions", json={"model": "tiny", "prompt": "still there?", "max_tokens": 3}
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    assert http.get("/health").status_code == 200
