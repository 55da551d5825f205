"""A server with ``--tokenizer-mode mistral`` over a tiny Mistral and its ``tekken.json``: chat
and completions answer with mistral_common's encoding of the request, and the ``mistral`` tool
parser reads the calls the model writes with the tokenizer's special tokens, whole and streamed,
and takes the tool's answer back in the next turn."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from infernetes.runtime.testing_tekken import make_tiny_tekken_mistral
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGUMENTS = {"city": "Paris", "note": "café ☀"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_tekken_mistral(tmp_path_factory.mktemp("tekken_server"))


@pytest.fixture(scope="module")
def reference(model_dir):
    return MistralTokenizer.from_file(str(model_dir / "tekken.json"))


@pytest.fixture(scope="module")
def server(model_dir, server_process_factory):
    process = server_process_factory(
        [
            str(model_dir),
            "--served-model-name",
            "tiny",
            "--tokenizer-mode",
            "mistral",
            "--max-model-len",
            "512",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "mistral",
            "--logits-processors",
            "force_text_processor:ForceText",
        ],
        env={"PYTHONPATH": str(Path(__file__).resolve().parent)},
        log_name="mistral-tokenizer.log",
    )
    with process:
        yield process


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")


def _call_ids(reference, name: str, arguments: dict) -> list[int]:
    """What a v11 Mistral writes to call ``name``: [TOOL_CALLS]name[ARGS]{...}, then EOS."""
    tekken = reference.instruct_tokenizer.tokenizer
    return [
        tekken.get_special_token("[TOOL_CALLS]"),
        *tekken.encode(name, bos=False, eos=False),
        tekken.get_special_token("[ARGS]"),
        *tekken.encode(json.dumps(arguments, ensure_ascii=False), bos=False, eos=False),
        tekken.eos_id,
    ]


def test_chat_prompt_is_mistral_commons_encoding(server, client, reference):
    expected = reference.encode_chat_completion(
        ChatCompletionRequest.from_openai(QUESTION, tools=TOOLS)
    ).tokens
    tokenized = httpx.post(
        f"{server.url}/tokenize", json={"model": "tiny", "messages": QUESTION, "tools": TOOLS}
    ).json()
    assert tokenized["tokens"] == expected
    reply = client.chat.completions.create(
        model="tiny", messages=QUESTION, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.choices[0].message.content is not None


def test_completion_prompt_is_tekken_encoding(client, reference):
    prompt = "The quick brown fox"
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, echo=True)
    tekken = reference.instruct_tokenizer.tokenizer
    assert reply.usage.prompt_tokens == len(tekken.encode(prompt, bos=True, eos=False))
    assert reply.choices[0].text.startswith(prompt)


def test_tool_call_then_the_answer(client, reference):
    force = {"vllm_xargs": {"force_ids": _call_ids(reference, "get_weather", ARGUMENTS)}}
    reply = client.chat.completions.create(
        model="tiny", messages=QUESTION, tools=TOOLS, max_tokens=64, extra_body=force
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    [call] = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS
    assert not message.content
    # The agent's next turn: the call and the tool's answer, encoded by mistral_common.
    follow_up = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"},
    ]
    answer = client.chat.completions.create(
        model="tiny", messages=follow_up, tools=TOOLS, max_tokens=4
    )
    assert answer.choices[0].message.content is not None


def test_streamed_tool_call(client, reference):
    force = {"vllm_xargs": {"force_ids": _call_ids(reference, "get_weather", ARGUMENTS)}}
    stream = client.chat.completions.create(
        model="tiny",
        messages=QUESTION,
        tools=TOOLS,
        max_tokens=64,
        stream=True,
        extra_body=force,
    )
    names, arguments, content = [], "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.function.name:
                names.append(call.function.name)
            arguments += call.function.arguments or ""
    assert names == ["get_weather"]
    assert json.loads(arguments) == ARGUMENTS
    assert content == ""


def test_a_request_template_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="chat_template"):
        client.chat.completions.create(
            model="tiny",
            messages=QUESTION,
            max_tokens=4,
            extra_body={"chat_template": "{{ messages }}"},
        )


@pytest.mark.parametrize(
    "placeholders", [None, {"image": "[IMG]"}], ids=["text_model", "vision_model"]
)
def test_image_parts_in_mistral_mode_are_a_400(tmp_path, placeholders):
    # A vision-language model (Mistral 3) hears that images there are planned, not that it
    # takes text only; a text model still hears that.
    from infernetes.runtime.server.chat_template import ChatRenderer
    from infernetes.runtime.server.errors import APIError
    from infernetes.runtime.testing_tekken import write_tekken
    from infernetes.runtime.tokenization.mistral import MistralTokenizer as Tekken

    renderer = ChatRenderer(
        Tekken(write_tekken(tmp_path)), None, "string", media_placeholders=placeholders
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look"}, image]}]
    with pytest.raises(APIError, match="planned" if placeholders else "text only") as error:
        renderer.encode_chat(messages, template=None, tools=None, continue_final_message=False)
    assert error.value.status == 400
