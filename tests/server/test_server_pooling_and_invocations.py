"""vLLM's extra routes: /pooling for embedding models (equal to /v1/embeddings), /invocations
(SageMaker's one route, dispatched by the payload's shape), /tokenizer_info (only with
--enable-tokenizer-info-endpoint)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from infernetes.runtime.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-bert"), "BertModel")


@pytest.fixture(scope="module")
def embed_server(server_process_factory, bert_dir):
    with server_process_factory(
        [str(bert_dir), "--task", "embed", "--served-model-name", "embedder"],
        log_name="pooling-server.log",
    ) as server:
        yield server


def post(server, path: str, body, headers=None) -> httpx.Response:
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(f"{server.url}{path}", headers=headers, timeout=60, **kwargs)


def test_pooling_equals_the_embeddings(embed_server):
    texts = ["hello world", "keys and values"]
    embedded = post(embed_server, "/v1/embeddings", {"model": "embedder", "input": texts}).json()
    pooled = post(embed_server, "/pooling", {"model": "embedder", "input": texts}).json()
    assert pooled["object"] == "list" and pooled["id"].startswith("pool-")
    assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]
    for got, want in zip(pooled["data"], embedded["data"], strict=True):
        assert got["index"] == want["index"]
        np.testing.assert_allclose(got["data"], want["embedding"], atol=1e-6)
    assert pooled["usage"] == embedded["usage"]


def test_invocations_routes_an_embedding_payload(embed_server):
    invoked = post(embed_server, "/invocations", {"input": "hello world"}).json()
    direct = post(embed_server, "/v1/embeddings", {"input": "hello world"}).json()
    assert invoked["object"] == "list"
    np.testing.assert_allclose(invoked["data"][0]["embedding"], direct["data"][0]["embedding"])
    wrong_kind = post(embed_server, "/invocations", {"prompt": "hello"})
    assert wrong_kind.status_code == 400 and wrong_kind.json()["error"]["param"] == "model"


def test_pooling_is_refused_on_a_generative_model(main_server, auth_headers):
    response = post(main_server, "/pooling", {"input": "x"}, auth_headers)
    assert response.status_code == 400


def test_invocations_routes_chat_and_completion_payloads(main_server, auth_headers):
    chat = post(
        main_server,
        "/invocations",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
        auth_headers,
    ).json()
    assert chat["object"] == "chat.completion"
    direct_chat = post(
        main_server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
        auth_headers,
    ).json()
    assert chat["choices"][0]["message"] == direct_chat["choices"][0]["message"]
    completion = post(
        main_server,
        "/invocations",
        {"prompt": "Hello", "max_tokens": 3, "temperature": 0},
        auth_headers,
    ).json()
    assert completion["object"] == "text_completion"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"nothing": 1}, 400, "routes by the payload"),
        (b"{oops", 400, "not valid JSON"),
        ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ],
)
def test_invocations_errors(main_server, auth_headers, body, status, message):
    response = post(main_server, "/invocations", body, auth_headers)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_tokenizer_info_is_off_by_default(main_server, auth_headers):
    response = httpx.get(f"{main_server.url}/tokenizer_info", headers=auth_headers, timeout=30)
    assert response.status_code == 404
    assert "--enable-tokenizer-info-endpoint" in response.json()["error"]["message"]
