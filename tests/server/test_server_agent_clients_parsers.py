"""Agent frameworks run their tool-calling loop with ``tool_choice`` auto against a server with
each model-specific ``--tool-call-parser``: the OpenAI Agents SDK (Chat Completions and Responses
models, streamed and not), LangChain's ChatOpenAI and pydantic-ai. The tiny random model writes
the parser's own format because a test-only ``--logits-processors`` class
(``force_text_processor.py``) makes it write the call, until the prompt holds the tool's answer;
the turn after it is the model's own free text. Streamed runs must see the arguments in pieces,
as the call is generated."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Literal

import openai
import pytest

CITY = Literal["Paris", "Oslo"]
DAYS = Literal[1, 2, 3]
ANSWER = "sunny-42"  # the tool's answer: once in the prompt, the model writes freely
MAX_TOKENS = 250  # more than any forced call takes (DeepSeek's ~160); the free text ends here
ARGS = {"city": "Paris", "days": 2}


def _json_call(name: str, args: dict) -> str:
    return json.dumps({"name": name, "arguments": args})


def _xml_parameters(args: dict, template: str) -> str:
    return "".join(template.format(key=k, value=v) for k, v in args.items())


# Each parser's format of one call, as its model's chat template writes it.
FORMATS = {
    "kimi_k2": lambda name, args: (
        f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
        f"<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
        "<|tool_calls_section_end|>"
    ),
    "deepseek_v3": lambda name, args: (
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n"
        f"{json.dumps(args)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "glm45": lambda name, args: (
        f"<tool_call>{name}\n"
        + _xml_parameters(args, "<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n")
        + "</tool_call>"
    ),
    "qwen3_coder": lambda name, args: (
        f"<tool_call>\n<function={name}>\n"
        + _xml_parameters(args, "<parameter={key}>\n{value}\n</parameter>\n")
        + "</function>\n</tool_call>"
    ),
    "minimax_m2": lambda name, args: (
        f'<minimax:tool_call>\n<invoke name="{name}">\n'
        + _xml_parameters(args, '<parameter name="{key}">{value}</parameter>\n')
        + "</invoke>\n</minimax:tool_call>"
    ),
    "xlam": lambda name, args: json.dumps([{"name": name, "arguments": args}]),
    "gigachat3": lambda name, args: f"function call<|role_sep|>\n{_json_call(name, args)}",
}
FORMATS["step3p5"] = FORMATS["qwen3_coder"]
# gpt-oss's harmony: reasoning on the analysis channel, then the call on commentary (the output
# opens after the prompt's ``<|start|>assistant``).
FORMATS["openai"] = lambda name, args: (
    "<|channel|>analysis<|message|>The weather tool answers that.<|end|>"
    f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
    f"<|message|>{json.dumps(args)}<|call|>"
)
# With openai, its reasoning parser too: the analysis channel becomes reasoning (Responses items).
HARMONY_ARGS = ["--reasoning-parser", "openai_gptoss"]


def forcing(parser: str, name: str = "get_weather", args: dict | None = None) -> dict:
    """The request body extra that makes the model call ``name`` in ``parser``'s format."""
    text = FORMATS[parser](name, args or ARGS)
    return {"vllm_xargs": {"force_text": text, "unless_prompt_has": ANSWER}}


@pytest.fixture(scope="module", params=sorted(FORMATS))
def server(request, tiny_llama_dir, server_process_factory):
    parser = request.param
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent)}
    if parser == "openai":
        env["TIKTOKEN_ENCODINGS_BASE"] = str(request.getfixturevalue("harmony_vocab"))
    process = server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "512",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            parser,
            "--logits-processors",
            "force_text_processor:ForceText",
            *(HARMONY_ARGS if parser == "openai" else []),
        ],
        env=env,
        log_name=f"agent-clients-{parser}.log",
    )
    try:
        process.wait_ready()
        yield parser, f"{process.url}/v1"
    finally:
        process.stop()


# -- the OpenAI Agents SDK ---------------------------------------------------------------------


def _agents_run(parser: str, base_url: str, responses: bool, streamed: bool):
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
        return ANSWER

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=kind(model="tiny", openai_client=client),
        model_settings=ModelSettings(
            max_tokens=MAX_TOKENS, temperature=0, extra_body=forcing(parser)
        ),
        # A Responses run whose free-text turn ends by length is an error to the SDK: it ends
        # at the tool's answer.
        tool_use_behavior="stop_on_first_tool" if responses else "run_llm_again",
    )

    async def run() -> tuple[str, int]:
        question = "Weather in Paris for two days?"
        if not streamed:
            result = await Runner.run(agent, question, max_turns=4)
            return str(result.final_output), 0
        result = Runner.run_streamed(agent, question, max_turns=4)
        pieces = 0
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type in (
                "response.function_call_arguments.delta"
            ):
                pieces += 1
        return str(result.final_output), pieces

    final, pieces = asyncio.run(run())
    return calls, final, pieces


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_openai_agents_sdk_calls_the_tool_then_answers(server, responses, streamed):
    parser, url = server
    calls, final, pieces = _agents_run(parser, url, responses, streamed)
    assert calls == [("Paris", 2)]
    assert isinstance(final, str) and (final == ANSWER) == responses
    if streamed:
        assert pieces > 1, "the arguments came in one piece"


# -- LangChain ---------------------------------------------------------------------------------


def test_langchain_binds_tools_calls_them_and_answers(server):
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    parser, url = server

    @tool
    def get_weather(city: CITY, days: DAYS) -> str:
        """Weather for a city."""
        return ANSWER

    llm = ChatOpenAI(
        model="tiny",
        base_url=url,
        api_key="none",
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body=forcing(parser),
    ).bind_tools([get_weather])
    question = HumanMessage("Weather in Paris for two days?")
    asked = llm.invoke([question])
    assert [(c["name"], c["args"]) for c in asked.tool_calls] == [("get_weather", ARGS)]
    results = [get_weather.invoke(c) for c in asked.tool_calls]
    answer = llm.invoke([question, asked, *results])
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls

    chunks = list(llm.stream([question]))
    pieces = [c for c in chunks if c.tool_call_chunks and c.tool_call_chunks[0].get("args")]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.tool_calls[0]["args"] == ARGS
    assert len(pieces) > 1, "the arguments came in one piece"


# -- pydantic-ai -------------------------------------------------------------------------------


def test_pydantic_ai_calls_the_tool_then_answers(server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    parser, url = server
    calls: list[tuple[str, int]] = []
    model = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=url, api_key="none"))
    agent = Agent(
        model,
        model_settings={"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": forcing(parser)},
    )

    @agent.tool_plain
    def get_weather(city: CITY, days: DAYS) -> str:
        """Weather for a city."""
        calls.append((city, days))
        return ANSWER

    result = agent.run_sync("Weather in Paris for two days?")
    assert calls == [("Paris", 2)] and isinstance(result.output, str)

    async def streamed() -> str:
        async with agent.run_stream("Weather in Paris for two days?") as stream:
            return await stream.get_output()

    assert isinstance(asyncio.run(streamed()), str) and calls == [("Paris", 2)] * 2
