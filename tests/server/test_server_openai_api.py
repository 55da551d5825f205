"""The OpenAI API of a real server, through the official ``openai`` client (sync, async and
streaming), plus vLLM's extra routes, auth, CORS, errors and /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

DATA = Path(__file__).parent / "data"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"enum": [1, 2, 3]}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(main_server):
    return openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )


@pytest.fixture
def async_client(main_server):
    return openai.AsyncOpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )


def regex_literal(text: str) -> str:
    """A regex matching exactly ``text`` (escaping the grammar library's metacharacters)."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in text)


def metrics(url: str) -> dict[str, float]:
    """{sample name with labels: value} from /metrics (open without the key)."""
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(
                f"{k}={v}"
                for k, v in sorted(sample.labels.items())
                if k not in ("model_name", "engine")  # one engine core
            )
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


# ---------------------------------------------------------------- models and completions


def test_models_lists_every_served_name(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny", "tiny-alias"]


def test_greedy_completion_equals_offline_engine(client, tiny_llama_dir):
    from infernetes import LLM, SamplingParams

    prompts = ["The quick brown fox", "Kubernetes schedules pods"]
    llm = LLM(model=str(tiny_llama_dir), max_model_len=256, seed=0)
    offline = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))
    for prompt, expected in zip(prompts, offline, strict=True):
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        assert got.choices[0].text == expected.outputs[0].text
        assert got.usage.completion_tokens == len(expected.outputs[0].token_ids)
        assert got.usage.prompt_tokens == len(expected.prompt_token_ids)
    # The same through the chat route: the templated prompt, generated greedily.
    messages = [{"role": "user", "content": "Hello! How are you today?"}]
    chat_offline = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=10))
    got = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0
    )
    assert got.choices[0].message.content == chat_offline[0].outputs[0].text


def test_completion_options(client):
    response = client.completions.create(
        model="tiny-alias",
        prompt=["Hello", "World"],
        max_tokens=5,
        n=2,
        temperature=0.8,
        seed=7,
        logprobs=2,
        echo=True,
        user="someone",
        extra_body={
            "top_k": 20,
            "min_p": 0.01,
            "repetition_penalty": 1.1,
            "min_tokens": 5,
            "ignore_eos": True,
        },
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.choices[0].text.startswith("Hello")
    for choice in response.choices:
        assert choice.finish_reason == "length"
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs)
        assert choice.logprobs.token_logprobs[0] is None  # the first echoed prompt token
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs[1:])
    assert response.usage.completion_tokens == 4 * 5
    by_ids = client.completions.create(model="tiny", prompt=[[5, 6, 7], [8, 9]], max_tokens=2)
    assert len(by_ids.choices) == 2 and by_ids.usage.prompt_tokens == 5
    again = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=5, temperature=0.8, seed=7
    )
    assert (
        again.choices[0].text
        == client.completions.create(
            model="tiny", prompt="Hello", max_tokens=5, temperature=0.8, seed=7
        )
        .choices[0]
        .text
    )


def test_stop_strings(client):
    base = client.completions.create(
        model="tiny", prompt="The cache keeps", max_tokens=12, temperature=0
    )
    text = base.choices[0].text
    stop = text[3:6]
    if not stop.strip():
        pytest.skip("greedy output has no usable stop string")
    stopped = client.completions.create(
        model="tiny", prompt="The cache keeps", max_tokens=12, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_streaming_completion_with_usage(client):
    whole = client.completions.create(
        model="tiny", prompt="Paged attention", max_tokens=10, temperature=0
    )
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="Paged attention",
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_async_client_concurrent(async_client):
    import asyncio

    results = await asyncio.gather(
        *[
            async_client.completions.create(
                model="tiny", prompt=f"Number {i}", max_tokens=4, temperature=0
            )
            for i in range(8)
        ]
    )
    assert all(r.usage.completion_tokens == 4 for r in results)
    stream = await async_client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    pieces = [chunk async for chunk in stream]
    assert pieces[0].choices[0].delta.role == "assistant"
    assert pieces[-1].choices[0].finish_reason == "length"


# ---------------------------------------------------------------- chat


def test_chat_streaming_matches_whole(client):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
    ]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    assert whole.choices[0].message.role == "assistant"
    assert len(whole.choices[0].logprobs.content) == 8
    assert all(len(t.top_logprobs) == 3 for t in whole.choices[0].logprobs.content)
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_json_schema(client):
    schema = {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    }
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Is Paris in France?"}],
        max_tokens=40,
        temperature=0.7,
        seed=1,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": schema},
        },
    )
    parsed = json.loads(response.choices[0].message.content)
    assert parsed["answer"] in ("yes", "no") and 0 <= parsed["confidence"] <= 9


def test_guided_choice_and_regex(client):
    choice = client.completions.create(
        model="tiny",
        prompt="Capital:",
        max_tokens=10,
        extra_body={"guided_choice": ["Paris", "Oslo"]},
    )
    assert choice.choices[0].text in ("Paris", "Oslo")
    regex = client.completions.create(
        model="tiny", prompt="Code:", max_tokens=10, extra_body={"guided_regex": "[0-9]{4}"}
    )
    assert len(regex.choices[0].text) == 4 and regex.choices[0].text.isdigit()


def test_chat_tool_choice_named_and_required(client):
    messages = [{"role": "user", "content": "Weather in Paris for two days?"}]
    named = client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=40,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city", "days"}
    required = client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=160,
        temperature=0,
        tool_choice="required",
        parallel_tool_calls=False,
    )
    assert required.choices[0].finish_reason == "tool_calls"
    calls = required.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Oslo")


def test_chat_auto_tool_choice_parses_hermes_calls(client):
    """tool_choice=auto: the hermes parser finds the call in the text; the regex makes the tiny
    random model write one, so the whole path (template with tools, parse, stream) is real."""
    call_text = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}</tool_call>'
    )
    kwargs = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        max_tokens=160,
        temperature=0,
        extra_body={"guided_regex": regex_literal("Checking. " + call_text)},
    )
    whole = client.chat.completions.create(**kwargs)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking."
    assert message.tool_calls[0].function.name == "get_weather"
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Oslo", "days": 1}
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed_calls = [
        tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])
    ]
    assert streamed_calls[0].function.name == "get_weather"
    assert streamed_calls[0].id and all(tc.index == 0 for tc in streamed_calls)
    # The arguments arrive in pieces as the model writes them, and join up to the whole answer.
    assert len([tc for tc in streamed_calls if tc.function.arguments]) > 1
    assert (
        "".join(tc.function.arguments or "" for tc in streamed_calls)
        == message.tool_calls[0].function.arguments
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# ---------------------------------------------------------------- errors


def test_errors_are_openai_shaped(client, main_server, auth_headers, maps_torch):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hello " * 100, max_tokens=200)
    assert "maximum context length is 256 tokens" in str(info.value)
    assert "200 in the completion" in str(info.value)
    with pytest.raises(
        openai.BadRequestError, match="max_tokens"
    ):  # 400, as OpenAI and vLLM answer
        client.completions.create(model="tiny", prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match=r"\(--max-logprobs\): 20") as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=1, logprobs=50)
    assert info.value.body["param"] == "logprobs"  # the engine's one check, named at the edge
    assert not maps_torch(main_server.process.pid)  # its error came back without torch
    with pytest.raises(openai.BadRequestError, match="guided_regex"):
        client.completions.create(
            model="tiny", prompt="x", max_tokens=1, extra_body={"guided_regex": "("}
        )
    with pytest.raises(openai.BadRequestError, match="started with --enable-prompt-embeds") as info:
        client.completions.create(
            model="tiny", prompt="", max_tokens=1, extra_body={"prompt_embeds": "AAAA"}
        )
    assert info.value.body["param"] == "prompt_embeds"
    assert not maps_torch(main_server.process.pid)  # refused before anything was read
    response = httpx.post(
        f"{main_server.url}/v1/chat/completions",
        headers=auth_headers,
        content=b"{not json",
        timeout=10,
    )
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    as_json = httpx.post(
        f"{main_server.url}/v1/chat/completions",
        content=b'{"model": "tiny", oops}',
        headers={**auth_headers, "content-type": "application/json"},
        timeout=10,
    )
    assert as_json.status_code == 400
    assert as_json.json()["error"]["message"].startswith(
        "the request body is not valid JSON: Expecting"
    )
    assert "at character 18" in as_json.json()["error"]["message"]
    assert as_json.json()["error"]["param"] is None


def test_api_key_required_except_open_routes(main_server):
    url = main_server.url
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "x"}).status_code == 401
    assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}).status_code == 401
    for path in ("/health", "/ping", "/version", "/metrics"):
        assert httpx.get(f"{url}{path}").status_code == 200, path


def test_cors(main_server):
    url = main_server.url
    preflight = httpx.options(
        f"{url}/v1/completions",
        headers={
            "Origin": "http://allowed.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://allowed.example"
    other = httpx.get(f"{url}/version", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    allowed = httpx.get(f"{url}/version", headers={"Origin": "http://allowed.example"})
    assert allowed.headers["access-control-allow-origin"] == "http://allowed.example"


# ---------------------------------------------------------------- extra routes


def test_tokenize_detokenize_version_load(main_server, auth_headers):
    url = main_server.url
    tokens = httpx.post(
        f"{url}/tokenize", json={"model": "tiny", "prompt": "Hello world"}, headers=auth_headers
    ).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 256
    text = httpx.post(
        f"{url}/detokenize", json={"tokens": tokens["tokens"]}, headers=auth_headers
    ).json()
    assert "Hello world" in text["prompt"]
    chat = httpx.post(
        f"{url}/tokenize",
        headers=auth_headers,
        json={"messages": [{"role": "user", "content": "hi"}]},
    ).json()
    assert chat["count"] > 2
    bad = httpx.post(f"{url}/detokenize", json={"tokens": [10**9]}, headers=auth_headers)
    assert bad.status_code == 400 and "tokens" in bad.json()["error"]["message"]
    assert httpx.get(f"{url}/version").json()["version"]
    assert httpx.get(f"{url}/load").json() == {"server_load": 0}
    response = httpx.get(f"{url}/v1/models", headers={**auth_headers, "X-Request-Id": "abc"})
    assert response.headers["x-request-id"] == "abc"
    assert httpx.get(f"{url}/openapi.json").json()["paths"]["/v1/chat/completions"]


def test_dev_mode_routes(main_server, auth_headers):
    url = main_server.url
    assert httpx.post(f"{url}/reset_prefix_cache", headers=auth_headers).status_code == 200
    assert httpx.get(f"{url}/is_sleeping", headers=auth_headers).json() == {"is_sleeping": False}
    assert httpx.post(f"{url}/sleep?level=1", headers=auth_headers).status_code == 200
    assert httpx.get(f"{url}/is_sleeping", headers=auth_headers).json() == {"is_sleeping": True}
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.post(f"{url}/wake_up", headers=auth_headers).status_code == 200
    assert httpx.get(f"{url}/is_sleeping", headers=auth_headers).json() == {"is_sleeping": False}
    # vLLM's tags: the weights first (an RL trainer updates them), then the KV cache
    assert httpx.post(f"{url}/sleep?level=2", headers=auth_headers).status_code == 200
    early = httpx.post(f"{url}/wake_up?tags=kv_cache", headers=auth_headers)
    assert early.status_code == 400 and "weights" in early.json()["error"]["message"]
    assert httpx.post(f"{url}/wake_up?tags=weights", headers=auth_headers).status_code == 200
    assert httpx.get(f"{url}/is_sleeping", headers=auth_headers).json() == {"is_sleeping": True}
    assert httpx.post(f"{url}/wake_up?tags=kv_cache", headers=auth_headers).status_code == 200
    assert httpx.get(f"{url}/is_sleeping", headers=auth_headers).json() == {"is_sleeping": False}
    rpc = httpx.post(
        f"{url}/collective_rpc", json={"method": "kv_cache_block_bytes"}, headers=auth_headers
    )
    assert rpc.status_code == 200 and rpc.json()["results"][0] > 0
    unknown = httpx.post(f"{url}/collective_rpc", json={"method": "_private"}, headers=auth_headers)
    assert unknown.status_code == 400 and "no method" in unknown.json()["error"]["message"]
    # the resolved configuration, its secrets masked (the server runs with an API key)
    info = httpx.get(f"{url}/server_info", headers=auth_headers).json()
    assert auth_headers["Authorization"].split()[1] not in json.dumps(info)
    config = info["vllm_config"]
    assert config["frontend"]["api_key"] == "***"
    assert config["ModelConfig"]["served_model_name"] == ["tiny", "tiny-alias"]


def test_metrics_move_with_traffic(client, main_server):
    names = json.loads((DATA / "vllm_metrics.json").read_text())
    before = metrics(main_server.url)
    for name in names["chapter6_current"] + names["v1_additions"]:
        assert any(k == name or k.startswith((name + "{", name + "_")) for k in before), name
    prompt = "Continuous batching lets new requests join a running batch at every step. " * 4
    for _ in range(2):  # the second one hits the prefix cache
        client.completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0)
    after = metrics(main_server.url)
    for name in (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total{finished_reason=length}",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_count",
    ):
        assert after[name] > before.get(name, 0), name
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 6
