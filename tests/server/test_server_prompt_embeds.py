"""The completions API's ``prompt_embeds`` (vLLM's: base64 of a ``torch.save``d tensor) with
``--enable-prompt-embeds``: a prompt sent as its token embeddings continues exactly as the same
prompt sent as token ids; what is not a tensor of the model's width is a 400 naming the field."""

from __future__ import annotations

import base64
import io
import pickle

import openai
import pytest
import torch
from safetensors.torch import load_file

PROMPT_IDS = [5, 17, 42, 8, 99, 23, 61, 7]


def _b64(value) -> str:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def embeds_server(tiny_llama_dir, server_process_factory):
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "model",
            "--dtype",
            "float32",
            "--max-model-len",
            "128",
            "--enable-prompt-embeds",
        ],
        log_name="prompt-embeds-server.log",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def embedding_table(tiny_llama_dir):
    weights = {}
    for path in sorted(tiny_llama_dir.glob("*.safetensors")):
        weights.update(load_file(path))
    return weights["model.embed_tokens.weight"].float()


def test_embeddings_continue_as_their_token_ids(embeds_server, embedding_table):
    client = openai.OpenAI(base_url=f"{embeds_server.url}/v1", api_key="-", max_retries=0)
    by_ids = client.completions.create(
        model="model", prompt=PROMPT_IDS, max_tokens=8, temperature=0.0
    )
    embeds = embedding_table[PROMPT_IDS]
    by_embeds = client.completions.create(
        model="model",
        prompt=None,
        max_tokens=8,
        temperature=0.0,
        extra_body={"prompt_embeds": _b64(embeds)},
    )
    assert by_embeds.choices[0].text == by_ids.choices[0].text
    assert by_embeds.usage.prompt_tokens == len(PROMPT_IDS)
    # a batch: the embeddings' prompts first, then the text's, as vLLM orders them
    both = client.completions.create(
        model="model",
        prompt=PROMPT_IDS,
        max_tokens=8,
        temperature=0.0,
        extra_body={"prompt_embeds": [_b64(embeds), _b64(embeds[:4])]},
    )
    assert [c.index for c in both.choices] == [0, 1, 2]
    assert both.choices[0].text == both.choices[2].text == by_ids.choices[0].text


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not base64!", "not valid base64"),
        (base64.b64encode(pickle.dumps({"a": 1})).decode(), "not a torch.save'd tensor"),
        (_b64(torch.zeros(4, 3)), "shape"),  # not the model's hidden size
        (_b64(torch.zeros(4, dtype=torch.long)), "shape"),
        (_b64([torch.zeros(2, 2)]), "one dense tensor"),
    ],
)
def test_what_is_not_an_embedding_is_a_400(embeds_server, payload, message):
    client = openai.OpenAI(base_url=f"{embeds_server.url}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=message) as info:
        client.completions.create(
            model="model", prompt=None, max_tokens=2, extra_body={"prompt_embeds": payload}
        )
    assert info.value.body["param"] == "prompt_embeds"
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(
            model="model",
            prompt=None,
            max_tokens=2,
            echo=True,
            extra_body={"prompt_embeds": _b64(torch.zeros(2, 8))},
        )
