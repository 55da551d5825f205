"""POST /v1/embeddings on a real server with a tiny BERT (--task embed), through the openai
client, equal to the offline engine's vectors."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from infernetes.runtime.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-bert"), "BertModel")


@pytest.fixture(scope="module")
def embed_server(server_process_factory, bert_dir):
    server = server_process_factory(
        [
            str(bert_dir),
            "--task",
            "embed",
            "--served-model-name",
            "embedder",
        ],
        log_name="embed-server.log",
    )
    server.wait_ready()
    yield server
    server.stop()


def test_embeddings_match_offline_engine(embed_server, bert_dir, maps_torch):
    from infernetes import LLM

    texts = ["hello world", "the cache keeps keys and values"]
    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="unused", max_retries=0)
    response = client.embeddings.create(model="embedder", input=texts)
    offline = LLM(model=str(bert_dir), task="embed").embed(texts)
    assert [d.index for d in response.data] == [0, 1]
    for data, expected in zip(response.data, offline, strict=True):
        np.testing.assert_allclose(data.embedding, expected.outputs.embedding, atol=1e-5)
    assert response.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in offline)

    raw = client.embeddings.with_raw_response.create(
        model="embedder", input="hello world", encoding_format="base64", dimensions=8
    )
    vector = np.frombuffer(
        base64.b64decode(raw.http_response.json()["data"][0]["embedding"]), dtype=np.float32
    )
    np.testing.assert_allclose(vector, offline[0].outputs.embedding[:8], atol=1e-5)
    assert not maps_torch(embed_server.process.pid)  # pooled vectors reach it as numpy


def test_generation_routes_refused_on_an_embedding_model(embed_server):
    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="embed"):
        client.completions.create(model="embedder", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="embedder", input="x", dimensions=10_000)
