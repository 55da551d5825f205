"""Agent frameworks run their tool-calling loop against the server, as users run them: the
OpenAI Agents SDK (Chat Completions and Responses models, streamed and not), LangChain's
ChatOpenAI and pydantic-ai. The tiny random model's turns are made well-formed by the request
itself: a forced tool choice (``required``) is constrained to the tools' schemas, and enum
parameters keep the arguments short; the turn after a tool result is free text (the frameworks
reset the tool choice), which ends each loop (the Responses runs end at the tool's answer).
Streamed runs must see the arguments in pieces."""

from __future__ import annotations

import asyncio
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

CITY = Literal["Paris", "Oslo"]
DAYS = Literal[1, 2, 3]
MAX_TOKENS = 120  # a whole call at the tiny vocabulary's token sizes; the free-text turn ends here


@pytest.fixture(scope="module")
def server(tiny_llama_dir, server_process_factory):
    process = server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "512",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--guided-decoding-disable-any-whitespace",
        ],
        log_name="agent-clients.log",
    )
    try:
        process.wait_ready()
        yield f"{process.url}/v1"
    finally:
        process.stop()


# -- the OpenAI Agents SDK ---------------------------------------------------------------------


def _agents_run(base_url: str, responses: bool, streamed: bool) -> tuple[list, str, int]:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[tuple[str, int]] = []

    @function_tool
    def get_weather(city: CITY, days: DAYS) -> str:
        """Weather for a city."""
        calls.append((city, days))
        return "sunny"

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=kind(model="tiny", openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required",
            max_tokens=MAX_TOKENS,
            temperature=0,
            # one call: a random model would go on adding calls to the list until the limit
            parallel_tool_calls=False if responses else None,
        ),
        # A Responses run whose free-text turn ends by length is an error to the SDK (it wants
        # the model's own end, which a random model never writes): it ends at the tool's answer.
        tool_use_behavior="stop_on_first_tool" if responses else "run_llm_again",
    )

    async def run() -> tuple[str, int]:
        if not streamed:
            result = await Runner.run(agent, "Weather in Paris for two days?", max_turns=4)
            return str(result.final_output), 0
        result = Runner.run_streamed(agent, "Weather in Paris for two days?", max_turns=4)
        argument_pieces = 0
        async for event in result.stream_events():
            if event.type == "raw_response_event" and (
                event.data.type == "response.function_call_arguments.delta"
            ):
                argument_pieces += 1
        return str(result.final_output), argument_pieces

    final, pieces = asyncio.run(run())
    return calls, final, pieces


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_openai_agents_sdk_calls_the_tool_then_answers(server, responses, streamed):
    calls, final, pieces = _agents_run(server, responses, streamed)
    # (tool_choice required may make several calls in one turn)
    assert calls and all(city in ("Paris", "Oslo") and days in (1, 2, 3) for city, days in calls)
    assert isinstance(final, str) and (final == "sunny") == responses
    if streamed:
        assert pieces > 1, "the arguments came in one piece"


# -- LangChain ---------------------------------------------------------------------------------


def test_langchain_binds_tools_calls_them_and_answers(server):
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: CITY, days: DAYS) -> str:
        """Weather for a city."""
        return "sunny"

    llm = ChatOpenAI(
        model="tiny", base_url=server, api_key="none", max_tokens=MAX_TOKENS, temperature=0
    )
    forced = llm.bind_tools([get_weather], tool_choice="any")
    question = HumanMessage("Weather in Oslo tomorrow?")
    asked = forced.invoke([question])
    call = asked.tool_calls[0]
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Oslo")
    results = [get_weather.invoke(c) for c in asked.tool_calls]
    answer = llm.bind_tools([get_weather]).invoke([question, asked, *results])
    assert isinstance(answer.content, str) and not answer.tool_calls

    chunks = list(forced.stream([question]))
    pieces = [c for c in chunks if c.tool_call_chunks and c.tool_call_chunks[0].get("args")]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.tool_calls[0]["args"] == call["args"]  # temperature 0: the same call
    assert len(pieces) > 1, "the arguments came in one piece"


# -- pydantic-ai -------------------------------------------------------------------------------


class Weather(BaseModel):
    city: CITY
    days: DAYS


def test_pydantic_ai_structured_output_through_its_output_tool(server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=server, api_key="none"))
    agent = Agent(model, output_type=Weather, model_settings={"max_tokens": MAX_TOKENS})
    result = agent.run_sync("Weather in Paris for three days?")
    assert isinstance(result.output, Weather)

    async def streamed() -> Weather:
        async with agent.run_stream("Weather in Oslo?") as stream:
            return await stream.get_output()

    assert isinstance(asyncio.run(streamed()), Weather)
