"""What chat templates receive besides the messages, as vLLM passes it: ``reasoning_effort`` from
--reasoning-effort for requests that give none (neither the OpenAI field nor chat_template_kwargs),
--default-chat-template-kwargs under the request's own, and the tools, also with tool_choice none
unless --exclude-tools-when-tool-choice-none."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.server.api_server import build_app
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.state import ServerState

from infernetes.schema.config import build_config

# Shows the effort it was given in the prompt, so /tokenize + /detokenize reveal it.
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}[effort={{ reasoning_effort }}]"


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = AsyncEngine.from_config(build_config(str(tiny_llama_dir), max_model_len=256, seed=0))
    yield engine
    asyncio.run(engine.shutdown())


def _client(engine, template_file, config_args: dict) -> httpx.AsyncClient:
    config = build_config("tiny", chat_template=str(template_file), **config_args)
    state = ServerState(FrontendSettings.from_config(config, environ={}))
    state.attach_engine(engine)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(state)), base_url="http://t"
    )


async def _rendered(http: httpx.AsyncClient, **extra) -> str:
    tokens = (
        await http.post(
            "/tokenize", json={"messages": [{"role": "user", "content": "hi"}], **extra}
        )
    ).json()
    return (await http.post("/detokenize", json={"tokens": tokens["tokens"]})).json()["prompt"]


async def _prompt_tokens(http: httpx.AsyncClient, **extra) -> int:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        **extra,
    }
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens"]


async def test_reasoning_effort_flag_reaches_the_chat_template(engine, tmp_path):
    template_file = tmp_path / "effort.jinja"
    template_file.write_text(TEMPLATE)
    async with _client(engine, template_file, {"reasoning_effort": "high"}) as http:
        assert (await _rendered(http)).endswith("[effort=high]")
        kwargs = {"chat_template_kwargs": {"reasoning_effort": "low"}}
        assert (await _rendered(http, **kwargs)).endswith("[effort=low]")  # the request's own wins
    async with _client(engine, template_file, {}) as http:
        assert (await _rendered(http)).endswith("[effort=]")  # unset: the template gets nothing


async def test_request_reasoning_effort_beats_the_flag_and_loses_to_template_kwargs(
    engine, tmp_path
):
    template_file = tmp_path / "long-when-high.jinja"
    template_file.write_text(
        "{{ messages[0]['content'] }}"
        "{% if reasoning_effort == 'high' %}{% for i in range(40) %} x{% endfor %}{% endif %}"
    )
    async with _client(engine, template_file, {"reasoning_effort": "high"}) as http:
        high = await _prompt_tokens(http)
        assert await _prompt_tokens(http, reasoning_effort="low") < high - 30
        kwargs = {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}
        assert await _prompt_tokens(http, **kwargs) == high
        bad = await http.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "reasoning_effort": "max",
            },
        )
        assert bad.status_code == 400 and "reasoning_effort" in bad.text


async def test_default_chat_template_kwargs_reach_the_template_under_the_requests_own(
    engine, tmp_path
):
    template_file = tmp_path / "kwargs.jinja"
    template_file.write_text(
        "{{ messages[0]['content'] }}[mode={{ mode }}][effort={{ reasoning_effort }}]"
    )
    defaults = {"default_chat_template_kwargs": {"mode": "terse", "reasoning_effort": "low"}}
    async with _client(engine, template_file, defaults) as http:
        assert (await _rendered(http)).endswith("[mode=terse][effort=low]")
        kwargs = {"chat_template_kwargs": {"mode": "verbose"}}
        assert (await _rendered(http, **kwargs)).endswith("[mode=verbose][effort=low]")
    both = {**defaults, "reasoning_effort": "high"}  # the flag of its own wins over the default
    async with _client(engine, template_file, both) as http:
        assert (await _rendered(http)).endswith("[mode=terse][effort=high]")


async def test_tools_stay_in_the_prompt_with_tool_choice_none_unless_excluded(engine, tmp_path):
    template_file = tmp_path / "tools.jinja"
    template_file.write_text(
        "{{ messages[0]['content'] }}{% if tools %}{% for i in range(40) %} x{% endfor %}{% endif %}"
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    extra = {"tools": [tool], "tool_choice": "none"}
    async with _client(engine, template_file, {}) as http:
        bare = await _prompt_tokens(http)
        assert await _prompt_tokens(http, **extra) > bare + 30  # vLLM's default: rendered
    flag = {"exclude_tools_when_tool_choice_none": True}
    async with _client(engine, template_file, flag) as http:
        assert await _prompt_tokens(http, **extra) == bare
