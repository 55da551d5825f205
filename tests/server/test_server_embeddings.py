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
            # a Matryoshka-trained model's config names the sizes it was trained for
            "--hf-overrides",
            '{"matryoshka_dimensions": [8, 16]}',
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
    # truncated, then normalized again as vLLM does (its pooler truncates before normalizing)
    head = np.asarray(offline[0].outputs.embedding[:8])
    np.testing.assert_allclose(vector, head / np.linalg.norm(head), atol=1e-5)
    assert not maps_torch(embed_server.process.pid)  # pooled vectors reach it as numpy


def test_generation_routes_refused_on_an_embedding_model(embed_server):
    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="embed"):
        client.completions.create(model="embedder", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match=r"only supports \[8, 16\]"):
        client.embeddings.create(model="embedder", input="x", dimensions=12)


def test_dimensions_refused_for_a_model_not_matryoshka_trained(tmp_path):
    """vLLM refuses ``dimensions`` when the model's config says nothing of Matryoshka training:
    its leading dimensions mean little alone."""
    import asyncio

    from infernetes.runtime.engine.messages import ModelFacts
    from infernetes.runtime.server.errors import APIError
    from infernetes.runtime.server.protocol import EmbeddingRequest
    from infernetes.runtime.server.serving_embedding import EmbeddingServing
    from infernetes.runtime.server.settings import FrontendSettings
    from infernetes.runtime.testing import build_tokenizer

    class Engine:
        tokenizer = build_tokenizer(tmp_path)
        max_model_len = 64
        model_config = ModelFacts(["BertModel"], 100, 1, {})

        async def encode(self, prompt, request_id):
            raise AssertionError("refused before it reaches the engine")

    serving = EmbeddingServing(Engine(), FrontendSettings())
    request = EmbeddingRequest(model="model", input="hello", dimensions=8)
    with pytest.raises(APIError, match="does not support matryoshka") as refused:
        asyncio.run(serving.create(request))
    assert refused.value.param == "dimensions"
