"""Request errors as OpenAI answers them (400 with ``param`` naming the field, so
``openai.BadRequestError`` catches them; malformed JSON said plainly), and prompt scoring:
``max_tokens: 0`` with ``echo`` returns the prompt's logprobs and generates nothing, as vLLM does."""

from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def client(main_server):
    return openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "tiny", "prompt": "x", "n": 0}, "n"),
        ({"model": "tiny", "prompt": 5}, "prompt"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "stream_options": {"include_usage": "x"}}, None),
    ],
)
def test_validation_errors_are_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**body)
    error = info.value.body
    assert info.value.status_code == 400
    assert set(error) >= {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param or error["param"].startswith(param + ".")
    else:
        assert error["param"].startswith("stream_options.include_usage")


def test_a_nested_field_is_named_by_its_path(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "", "content": "hi"}])
    assert info.value.body["param"] == "messages.0.role"


def test_malformed_json_says_what_and_where(main_server, auth_headers):
    response = httpx.post(
        f"{main_server.url}/v1/completions",
        content=b'{"model": "tiny",\n "prompt": "x",, }',
        headers={**auth_headers, "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] is None  # not a field: the offset is in the message
    assert error["message"].startswith("the request body is not valid JSON")
    assert "at character" in error["message"]


def test_max_tokens_0_with_echo_scores_the_prompt(client, main_server, auth_headers):
    prompt = "The quick brown fox jumps"
    scored = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = scored.choices[0]
    assert choice.text == prompt
    assert scored.usage.completion_tokens == 0
    tokens = httpx.post(
        f"{main_server.url}/tokenize",
        json={"model": "tiny", "prompt": prompt},
        headers=auth_headers,
        timeout=30,
    ).json()["tokens"]
    assert len(choice.logprobs.tokens) == len(tokens)
    assert choice.logprobs.token_logprobs[0] is None  # nothing before the first token
    assert all(isinstance(lp, float) for lp in choice.logprobs.token_logprobs[1:])
    # The same numbers as the prompt part of an ordinary echo request.
    echoed = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, echo=True, logprobs=1, temperature=0
    ).choices[0]
    assert echoed.logprobs.token_logprobs[: len(tokens)] == pytest.approx(
        choice.logprobs.token_logprobs, nan_ok=True
    )


def test_max_tokens_0_with_echo_streams_only_the_prompt(client):
    prompt = "Scoring a streamed prompt"
    chunks = list(
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == prompt
    assert chunks[-1].choices[0].finish_reason == "length"
