"""The ``structured_outputs`` request field (current vLLM's form; ``guided_*`` is the older one)
constrains what a random tiny model writes, through the same llguidance backend; request fields
the server does not know are logged once per name; --structured-outputs-config reaches the
server's settings."""

from __future__ import annotations

import json
import re

import openai
import pytest
from infernetes.runtime.server.settings import FrontendSettings

from infernetes.schema.config import build_config

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(main_server):
    return openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )


def complete(client, structured: dict, max_tokens: int = 60, **extra) -> str:
    response = client.completions.create(
        model="tiny",
        prompt="Answer:",
        max_tokens=max_tokens,
        temperature=1.0,
        seed=3,
        extra_body={"structured_outputs": structured, **extra},
    )
    return response.choices[0].text


@pytest.mark.parametrize(
    ("structured", "check"),
    [
        ({"json": SCHEMA}, lambda s: json.loads(s)["answer"] in ("yes", "no")),
        ({"json": json.dumps(SCHEMA)}, lambda s: set(json.loads(s)) == {"answer", "n"}),
        ({"regex": "[ab]{3}-[0-9]"}, lambda s: re.fullmatch("[ab]{3}-[0-9]", s)),
        ({"choice": ["red", "green", "blue"]}, lambda s: s in ("red", "green", "blue")),
        ({"grammar": 'root ::= "yes" | "no" | "maybe"'}, lambda s: s in ("yes", "no", "maybe")),
        # a random model's object may not close within the budget: it opens one at least
        ({"json_object": True}, lambda s: s.startswith("{")),
    ],
    ids=["json", "json-text", "regex", "choice", "grammar", "json_object"],
)
def test_structured_outputs_constrain_completions(
    client, structured, check, main_server, maps_torch
):
    text = complete(client, structured, max_tokens=120)
    assert check(text), text
    # The grammar is compiled in the API process; the masks (torch) are applied in the core's.
    assert not maps_torch(main_server.process.pid)


def test_structured_outputs_constrain_chat(client):
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Pick a colour"}],
        max_tokens=20,
        temperature=1.0,
        seed=5,
        extra_body={"structured_outputs": {"choice": ["cyan", "magenta"]}},
    )
    assert response.choices[0].message.content in ("cyan", "magenta")


def test_disable_any_whitespace_per_request(client):
    text = complete(client, {"json": SCHEMA, "disable_any_whitespace": True}, max_tokens=120)
    assert text == json.dumps(json.loads(text), separators=(",", ":"))


@pytest.mark.parametrize(
    ("structured", "extra", "param"),
    [
        ({"regex": "a", "choice": ["b"]}, {}, "structured_outputs"),
        ({}, {}, "structured_outputs"),
        ({"choice": []}, {}, "structured_outputs"),
        ({"regex": "a"}, {"guided_choice": ["b"]}, "body"),
        ({"regex": "("}, {}, "structured_outputs.regex"),
        ({"structural_tag": "{}"}, {}, "structured_outputs.structural_tag"),
    ],
)
def test_bad_structured_outputs_are_400(client, structured, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, structured, **extra)
    assert info.value.body["param"] == param, info.value.body


def test_unknown_request_fields_are_logged_once_per_name(client, main_server):
    for _ in range(3):
        client.completions.create(
            model="tiny",
            prompt="x",
            max_tokens=1,
            extra_body={"not_a_field_xyz": 1, "another_unknown_abc": {"a": 1}},
        )
    log = main_server.log_path.read_text(errors="replace")
    warnings = [line for line in log.splitlines() if "not_a_field_xyz" in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0] and "another_unknown_abc" in warnings[0]


def test_structured_outputs_config_reaches_the_settings():
    settings = FrontendSettings.from_config(
        build_config(
            "m",
            structured_outputs_config={
                "backend": "guidance",
                "disable_any_whitespace": True,
                "reasoning_parser": "qwen3",
            },
        ),
        environ={},
    )
    assert settings.guided_decoding_backend == "guidance"
    assert settings.guided_decoding_disable_any_whitespace is True
    assert settings.reasoning_parser == "qwen3"
    older = FrontendSettings.from_config(
        build_config("m", guided_decoding_disable_any_whitespace=True), environ={}
    )
    assert older.guided_decoding_disable_any_whitespace is True
