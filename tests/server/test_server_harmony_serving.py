"""gpt-oss's harmony format served: ``--tool-call-parser openai`` with ``--reasoning-parser
openai_gptoss`` through Chat Completions (``reasoning_content``, tool calls, whole and streamed
as generated, cut by max_tokens) and the Responses API (reasoning items, function calls). The
tiny model writes harmony output because the test-only ``force_text_processor`` makes it."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

ARGS = {"city": "Zürich", "filters": {"tags": ["café", "日本語"], "days": [1, 2]}}
REASONING = "The user wants the weather — zwei Tage."
ANALYSIS = f"<|channel|>analysis<|message|>{REASONING}<|end|>"
CALL = (
    ANALYSIS + "<|start|>assistant<|channel|>commentary to=functions.get_weather "
    f"<|constrain|>json<|message|>{json.dumps(ARGS, ensure_ascii=False)}<|call|>"
)
ANSWER = "Sunny, 21 °C — 晴れ."
FINAL = ANALYSIS + f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Zürich?"}]


def forcing(text: str) -> dict:
    return {"vllm_xargs": {"force_text": text}}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, server_process_factory, harmony_vocab):
    process = server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "512",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "openai",
            "--reasoning-parser",
            "openai_gptoss",
            "--logits-processors",
            "force_text_processor:ForceText",
        ],
        env={
            "PYTHONPATH": str(Path(__file__).resolve().parent),
            "TIKTOKEN_ENCODINGS_BASE": str(harmony_vocab),
        },
        log_name="harmony.log",
    )
    with process:
        yield process


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def _chat(client, text: str, max_tokens: int = 400, **kwargs):
    return client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=max_tokens,
        extra_body=forcing(text),
        **kwargs,
    )


def test_chat_call_with_reasoning(client):
    choice = _chat(client, CALL).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == REASONING
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS


def test_chat_final_answer_with_reasoning(client):
    choice = _chat(client, FINAL).choices[0]
    assert choice.message.reasoning_content == REASONING
    assert choice.message.content == ANSWER and not choice.message.tool_calls


def test_chat_streams_reasoning_then_the_call_as_it_is_generated(client):
    reasoning, pieces, finish = "", [], None
    for chunk in _chat(client, CALL, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        assert not delta.content
        pieces += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == REASONING and finish == "tool_calls"
    assert pieces[0].function.name == "get_weather" and pieces[0].id
    assert len(pieces) > 3, "the arguments came in one piece"
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == ARGS


def test_a_call_cut_by_max_tokens_never_becomes_content(client, tiny_llama_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    mid_arguments = CALL[: CALL.index("日本語")]
    cut = len(tokenizer.encode(mid_arguments, add_special_tokens=False))
    whole = _chat(client, CALL, max_tokens=cut).choices[0]
    assert whole.finish_reason == "length" and not whole.message.tool_calls
    assert not whole.message.content and whole.message.reasoning_content == REASONING
    content = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in _chat(client, CALL, max_tokens=cut, stream=True)
        if chunk.choices
    )
    assert content == ""


def test_responses_reasoning_item_and_function_call(client):
    kwargs = dict(
        model="tiny",
        input="Weather in Zürich?",
        tools=[{"type": "function", **TOOLS[0]["function"]}],
        max_output_tokens=400,
        extra_body=forcing(CALL),
    )
    response = client.responses.create(**kwargs)
    kinds = [item.type for item in response.output]
    assert set(kinds) == {"reasoning", "function_call"}
    (reasoning,) = [item for item in response.output if item.type == "reasoning"]
    assert reasoning.content[0].text == REASONING
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == ARGS

    events = list(client.responses.create(stream=True, **kwargs))
    arguments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(arguments) > 1 and json.loads("".join(arguments)) == ARGS
    final = events[-1].response
    assert [item.type for item in final.output] == [item.type for item in response.output]
    thought = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert len(thought) > 1 and "".join(thought) == REASONING  # streamed as generated
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index(
        "response.function_call_arguments.delta"
    )
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == REASONING


def test_responses_final_answer_is_the_message(client):
    response = client.responses.create(
        model="tiny", input="Weather?", max_output_tokens=400, extra_body=forcing(FINAL)
    )
    assert response.output_text == ANSWER
    assert [item.type for item in response.output] == ["reasoning", "message"]
