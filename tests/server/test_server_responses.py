"""The Responses API (POST /v1/responses, GET /v1/responses/{id}) through the official openai
client's ``client.responses``: plain, streamed, instructions, input items, function tools,
``text.format`` json_schema, ``previous_response_id``, ``store: false`` and ``truncation``. The tiny model is
random, so checks are on what the server guarantees: the same tokens as the chat path, the
shapes, and constraints that hold."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def client(main_server):
    return openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )


def test_plain_response_equals_the_chat_path(client):
    response = client.responses.create(
        model="tiny",
        instructions="Be brief.",
        input="Hello there",
        max_output_tokens=8,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert response.object == "response" and response.id.startswith("resp")
    assert response.output_text == chat.choices[0].message.content
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.status == (
        "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    )
    assert response.output[0].status == response.status  # a message cut short is incomplete
    assert response.instructions == "Be brief."


def test_input_items(client):
    items = [
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "input_text", "text": "Colour of the sky?"}]},
    ]
    response = client.responses.create(
        model="tiny", input=items, max_output_tokens=5, temperature=0
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Colour of the sky?"},
        ],
        max_tokens=5,
        temperature=0,
    )
    assert response.output_text == chat.choices[0].message.content


def test_streamed_events_add_up_to_the_response(client):
    kwargs = dict(model="tiny", input="Stream this", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.status for item in done] == [item.status for item in whole.output]
    if kinds[-1] == "response.incomplete":
        assert whole.output[-1].type == "message" and whole.output[-1].status == "incomplete"
    for kind in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert kind in kinds


def test_function_tool_call_and_its_result(client):
    first = client.responses.create(
        model="tiny",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=30,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    follow_up = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        max_output_tokens=5,
        temperature=0,
    )
    assert follow_up.previous_response_id == first.id
    assert follow_up.output[0].type == "message"


def test_streamed_function_call(client):
    events = list(
        client.responses.create(
            model="tiny",
            input="Weather in Oslo?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=30,
            stream=True,
        )
    )
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == arguments
    assert json.loads(arguments)["city"] in ("Paris", "Oslo")


def test_text_format_json_schema(client):
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model="tiny",
        input="Is it raining?",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
        max_output_tokens=30,
    )
    assert json.loads(response.output_text)["answer"] in ("yes", "no")


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(
        model="tiny", input="My name is Ada.", max_output_tokens=4, temperature=0
    )
    second = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=4,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    fetched = client.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == second.output_text


def test_store_false_keeps_nothing(client):
    response = client.responses.create(
        model="tiny", input="Forget me", max_output_tokens=2, store=False
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(
            model="tiny", previous_response_id=response.id, input="x", max_output_tokens=2
        )
    assert info.value.body["param"] == "previous_response_id"


def test_unsupported_tools_and_items_are_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}])
    assert info.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input=[{"type": "image_generation_call", "id": "x"}])
    assert info.value.body["param"] == "input[0]"


def test_truncation_auto_drops_the_oldest_items_and_disabled_refuses(
    client, main_server, auth_headers
):
    filler = "The cache keeps keys and values of earlier tokens so that decoding does not recompute them."
    items = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {filler} {filler}"}
        for i in range(10)
    ]

    def prompt_tokens(messages: list[dict]) -> int:
        body = {"model": "tiny", "messages": messages}
        answer = httpx.post(
            f"{main_server.url}/tokenize", json=body, headers=auth_headers, timeout=30
        )
        return answer.json()["count"]

    max_model_len, max_output = 256, 16
    assert prompt_tokens(items) + max_output > max_model_len  # the whole conversation is too long
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(
            model="tiny", input=items, max_output_tokens=max_output, truncation="disabled"
        )
    response = client.responses.create(
        model="tiny", input=items, max_output_tokens=max_output, truncation="auto", temperature=0
    )
    assert response.truncation == "auto"
    # the longest tail of the conversation that fits, as the server's chat template counts it
    first_kept = next(
        k for k in range(len(items)) if prompt_tokens(items[k:]) + max_output <= max_model_len
    )
    assert first_kept > 0
    assert response.usage.input_tokens == prompt_tokens(items[first_kept:])


def test_vllm_extras_reach_the_chat_path():
    """vLLM's Responses extras: ``vllm_xargs`` (the --logits-processors' arguments) and
    ``chat_template_kwargs`` (a hybrid reasoning model's thinking switch among them)."""
    from infernetes.runtime.server.protocol import ResponsesRequest
    from infernetes.runtime.server.serving_responses import _chat_fields

    request = ResponsesRequest(
        input="hi", vllm_xargs={"force": 3}, chat_template_kwargs={"thinking": True}
    )
    fields = _chat_fields(request)
    assert fields["vllm_xargs"] == {"force": 3}
    assert fields["chat_template_kwargs"] == {"thinking": True}
