"""A server started with ``--structured-outputs-config '{"backend": "xgrammar"}'`` constrains what
a random tiny model writes through xgrammar; a request naming another backend is a 400 (the
backend is chosen per server, as in vLLM V1)."""

from __future__ import annotations

import json
import re

import openai
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
    "required": ["answer", "n"],
}


@pytest.fixture(scope="module")
def client(tiny_llama_dir, server_process_factory):
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "256",
            "--structured-outputs-config",
            json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        ],
        log_name="xgrammar-server.log",
    ) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def complete(client, structured: dict, **extra) -> str:
    response = client.completions.create(
        model="tiny",
        prompt="Answer:",
        max_tokens=120,
        temperature=1.0,
        seed=3,
        extra_body={"structured_outputs": structured, **extra},
    )
    return response.choices[0].text


@pytest.mark.parametrize(
    ("structured", "check"),
    [
        ({"json": SCHEMA}, lambda s: json.loads(s)["answer"] in ("yes", "no")),
        ({"regex": r"[ab]{3}-\d"}, lambda s: re.fullmatch("[ab]{3}-[0-9]", s)),
        ({"choice": ["red", 'say "hi"', "blue"]}, lambda s: s in ("red", 'say "hi"', "blue")),
        ({"grammar": 'root ::= "yes" | "no"'}, lambda s: s in ("yes", "no")),
        ({"grammar": 'start: "a" ("b" | "c")'}, lambda s: s in ("ab", "ac")),
    ],
    ids=["json", "regex", "choice", "gbnf", "lark"],
)
def test_xgrammar_constrains_completions(client, structured, check):
    text = complete(client, structured)
    assert check(text), text


def test_a_bad_constraint_is_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, {"regex": "("})
    assert "structured_outputs.regex" in str(info.value)


def test_a_request_naming_another_backend_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, {"regex": "[ab]"}, guided_decoding_backend="guidance")
    assert "chosen per server" in str(info.value) and "xgrammar" in str(info.value)
