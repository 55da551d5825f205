"""A model-specific tool-call parser and reasoning parser end to end: a real server started with
``--tool-call-parser kimi_k2 --reasoning-parser glm45``, through the official ``openai`` client,
whole and streamed. A regex makes the tiny random model write Kimi K2's format."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.test_server_openai_api import WEATHER_TOOL, regex_literal

CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Oslo", "days": 1}<|tool_call_end|>'
    "<|tool_calls_section_end|>"
)
OUTPUT = "<think>Kimi-style plan</think>Checking." + CALL


@pytest.fixture(scope="module")
def client(tiny_llama_dir, server_process_factory):
    server = server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "512",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "kimi_k2",
            "--reasoning-parser",
            "glm45",
            "--seed",
            "0",
        ],
        log_name="kimi-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


def test_kimi_calls_and_reasoning_whole_and_streamed(client):
    kwargs = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        max_tokens=300,
        temperature=0,
        extra_body={"guided_regex": regex_literal(OUTPUT)},
    )
    whole = client.chat.completions.create(**kwargs)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking."
    assert message.model_extra["reasoning_content"] == "Kimi-style plan"
    (call,) = message.tool_calls
    assert call.id == "functions.get_weather:0" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 1}

    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    pieces = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(p.id, p.function.name) for p in pieces if p.function.name] == [
        ("functions.get_weather:0", "get_weather")
    ]
    assert len([p for p in pieces if p.function.arguments]) > 1
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert "".join(d.content or "" for d in deltas) == "Checking."
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "Kimi-style plan"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
