"""Chat features on a real engine, in-process (no subprocess): reasoning parsers, chat templates
and their content formats, response role, echo, tokens as ids, the periodic stats line."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.server.api_server import build_app
from infernetes.runtime.server.chat_template import resolve_content_format
from infernetes.runtime.server.log_stats import LoggingStatLogger
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.sse_reader import asse_lines
from infernetes.runtime.server.state import ServerState

from infernetes.schema.config import build_config

# Loops over the parts of each message: wants the "openai" content format.
PARTS_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{% for part in m['content'] %}"
    "{{ part['text'] }}{% endfor %}{% endfor %}{% if add_generation_prompt %}[go]{% endif %}"
)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = AsyncEngine.from_config(build_config(str(tiny_llama_dir), max_model_len=256, seed=0))
    yield engine
    asyncio.run(engine.shutdown())


def client(engine, **settings) -> httpx.AsyncClient:
    state = ServerState(FrontendSettings(model="tiny", served_model_names=("tiny",), **settings))
    state.attach_engine(engine)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(state)), base_url="http://t"
    )


def chat_body(**extra):
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Think first."}],
        "max_tokens": 40,
        "temperature": 0,
        **extra,
    }


async def _stream_deltas(http: httpx.AsyncClient, body: dict) -> list[dict]:
    deltas = []
    async with http.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}
    ) as response:
        async for line in asse_lines(response.aiter_text()):
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                deltas += [c["delta"] for c in event["choices"]]
    return deltas


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
async def test_reasoning_content_is_split_whole_and_streamed(engine, parser):
    body = chat_body(guided_regex=r"<think>plan it</think>The answer\.")
    async with client(engine, reasoning_parser=parser) as http:
        message = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0][
            "message"
        ]
        assert message["reasoning_content"] == "plan it"
        assert message["content"] == "The answer."
        deltas = await _stream_deltas(http, body)
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "plan it"
    assert "".join(d.get("content") or "" for d in deltas) == "The answer."


@pytest.mark.parametrize(
    ("template_kwargs", "default_kwargs", "thinks"),
    [
        ({"thinking": True}, None, True),
        ({"enable_thinking": True}, None, True),
        (None, {"thinking": True}, True),  # --default-chat-template-kwargs
        ({"thinking": False}, {"thinking": True}, False),
        (None, None, False),
    ],
)
async def test_deepseek_v3_reasons_only_when_its_template_is_told_to_think(
    engine, template_kwargs, default_kwargs, thinks
):
    text = "plan it</think>The answer."
    body = chat_body(guided_regex=r"plan it</think>The answer\.")
    if template_kwargs is not None:
        body["chat_template_kwargs"] = template_kwargs
    expected = ("plan it", "The answer.") if thinks else (None, text)
    async with client(
        engine, reasoning_parser="deepseek_v3", chat_template_kwargs=default_kwargs
    ) as http:
        message = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0][
            "message"
        ]
        assert (message["reasoning_content"], message["content"]) == expected
        deltas = await _stream_deltas(http, body)
    streamed = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert (streamed or None, "".join(d.get("content") or "" for d in deltas)) == expected


async def test_chat_template_options(engine, tiny_llama_dir, tmp_path):
    template_file = tmp_path / "parts.jinja"
    template_file.write_text(PARTS_TEMPLATE)
    assert resolve_content_format("auto", PARTS_TEMPLATE) == "openai"
    async with client(engine, chat_template=str(template_file)) as http:
        tokens = (
            await http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        ).json()
        text = (await http.post("/detokenize", json={"tokens": tokens["tokens"]})).json()["prompt"]
        assert text == "[user]hi[go]"
    inline = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    async with client(engine) as http:  # a request's own template needs the server's consent
        refused = await http.post("/v1/chat/completions", json=chat_body(chat_template=inline))
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template"
        assert "--trust-request-chat-template" in refused.json()["error"]["message"]
    async with client(engine, response_role="bot", trust_request_chat_template=True) as http:
        response = await http.post(
            "/v1/chat/completions", json=chat_body(chat_template=inline, max_tokens=3)
        )
        assert response.json()["choices"][0]["message"]["role"] == "bot"
        broken = await http.post("/v1/chat/completions", json=chat_body(chat_template="{% for %}"))
        assert broken.status_code == 400 and "chat template" in broken.json()["error"]["message"]


async def test_echo_continue_and_token_ids(engine):
    async with client(engine) as http:
        body = chat_body(
            messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}],
            continue_final_message=True,
            echo=True,
            max_tokens=3,
        )
        message = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0][
            "message"
        ]
        assert message["content"].startswith("Well,")
        completion = (
            await http.post(
                "/v1/completions",
                json={
                    "model": "tiny",
                    "prompt": "Hello",
                    "max_tokens": 3,
                    "logprobs": 1,
                    "return_tokens_as_token_ids": True,
                },
            )
        ).json()
        assert all(
            t.startswith("token_id:") for t in completion["choices"][0]["logprobs"]["tokens"]
        )
        scored = (
            await http.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1, "prompt_logprobs": 2},
            )
        ).json()
        positions = scored["choices"][0]["prompt_logprobs"]
        assert positions[0] is None and len(positions) == 3
        assert "6" in positions[1] and len(positions[1]) >= 2  # the actual token and the top 2


def test_periodic_stats_line(caplog):
    from infernetes.runtime.engine.stats import IterationStats, PrefixCacheStats, SchedulerStats

    stats_logger = LoggingStatLogger(interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="infernetes.runtime.server.stats"):
        stats_logger.record(
            SchedulerStats(
                num_running_reqs=2,
                num_waiting_reqs=1,
                kv_cache_usage=0.5,
                prefix_cache_stats=PrefixCacheStats(queries=10, hits=5),
            ),
            IterationStats(num_prompt_tokens=8, num_generation_tokens=2),
        )
    line = caplog.records[-1].getMessage()
    assert "Running: 2 reqs, Waiting: 1 reqs" in line
    assert "GPU KV cache usage: 50.0%" in line and "Prefix cache hit rate: 50.0%" in line
    assert "MM cache" not in line  # a text model's: no processor cache looked up


def test_periodic_stats_line_with_the_multimodal_cache(caplog):
    from infernetes.runtime.engine.stats import IterationStats, MultiModalCacheStats

    stats_logger = LoggingStatLogger(interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="infernetes.runtime.server.stats"):
        stats_logger.record(None, IterationStats(mm_cache_stats=MultiModalCacheStats(3, 1)))
        stats_logger.record(None, IterationStats(mm_cache_stats=MultiModalCacheStats(1, 0)))
    line = caplog.records[-1].getMessage()
    assert line.endswith("Prefix cache hit rate: 0.0%, MM cache hit rate: 25.0%")


async def test_tokenize_returns_token_strings_when_asked(engine):
    async with client(engine) as http:
        plain = (await http.post("/tokenize", json={"prompt": "hello world"})).json()
        assert plain["token_strs"] is None
        asked = (
            await http.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True})
        ).json()
    tokenizer = engine.tokenizer
    assert asked["token_strs"] == tokenizer.convert_ids_to_tokens(asked["tokens"])
    assert len(asked["token_strs"]) == asked["count"] > 0


TOOLS_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% for t in tools or [] %}[tool {{ t['function']['name'] }}]{% endfor %}"
)


async def test_tokenize_counts_what_the_chat_sends(engine, tmp_path):
    """/tokenize of a chat and the chat itself render through one path: with tools in the
    prompt, the count /tokenize gives is the chat's prompt_tokens."""
    template_file = tmp_path / "tools.jinja"
    template_file.write_text(TOOLS_TEMPLATE)
    tool = {"type": "function", "function": {"name": "weather", "parameters": {}}}
    messages = [{"role": "user", "content": "Rain in Paris?"}]
    async with client(engine, chat_template=str(template_file)) as http:
        counted = (
            await http.post("/tokenize", json={"messages": messages, "tools": [tool]})
        ).json()
        served = await http.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "tools": [tool], "max_tokens": 1},
        )
    assert served.status_code == 200, served.text
    assert counted["count"] == served.json()["usage"]["prompt_tokens"]
    without_tools = await _count(engine, template_file, messages)
    assert counted["count"] > without_tools


async def _count(engine, template_file, messages) -> int:
    async with client(engine, chat_template=str(template_file)) as http:
        return (await http.post("/tokenize", json={"messages": messages})).json()["count"]
