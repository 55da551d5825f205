"""/score, /v1/score, /rerank (v1, v2), /classify on tiny BertForSequenceClassification
cross-encoders made here (random weights, a tokenizer trained here that writes pairs as
``[CLS] a [SEP] b [SEP]`` with token types), equal to transformers' outputs."""

from __future__ import annotations

import httpx
import pytest
import torch

QUERY = "where do the keys and values live"
DOCUMENTS = [
    "the cache keeps keys and values in blocks",
    "a scheduler picks requests",
    "tokens stream back to the client",
]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def make_cross_encoder(directory, num_labels: int, seed: int):
    import transformers
    from infernetes.runtime.testing import _CORPUS
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    directory.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    hf_tokenizer.save_pretrained(str(directory))
    config = transformers.BertConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        type_vocab_size=2,
        initializer_range=0.2,
        num_labels=num_labels,
        pad_token_id=hf_tokenizer.pad_token_id,
    )
    if num_labels > 1:
        config.id2label = LABELS
        config.label2id = {v: k for k, v in LABELS.items()}
    config.architectures = ["BertForSequenceClassification"]
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(str(directory))
    return directory


def reference_logits(directory, *texts) -> torch.Tensor:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.BertForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        return model(**tokenizer(*texts, return_tensors="pt")).logits[0]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory, server_process_factory):
    root = tmp_path_factory.mktemp("cross-encoders")
    scorer = make_cross_encoder(root / "scorer", 1, seed=1)
    classifier = make_cross_encoder(root / "classifier", 3, seed=2)
    common = ["--dtype", "float32", "--max-model-len", "128"]
    servers = [
        server_process_factory(
            [str(scorer), "--served-model-name", "scorer", *common], log_name="scorer.log"
        ),
        server_process_factory(
            [str(classifier), "--served-model-name", "classifier", "--task", "classify", *common],
            log_name="classifier.log",
        ),
    ]
    try:
        for server in servers:  # both load at once
            server.wait_ready()
        yield {"scorer": (servers[0], scorer), "classifier": (servers[1], classifier)}
    finally:
        for server in servers:
            server.stop()


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_equals_transformers(encoders, path):
    server, folder = encoders["scorer"]
    response = post(server, path, {"model": "scorer", "text_1": QUERY, "text_2": DOCUMENTS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2]
    for data, document in zip(body["data"], DOCUMENTS, strict=True):
        expected = torch.sigmoid(reference_logits(folder, QUERY, document))[0]
        assert data["score"] == pytest.approx(float(expected), abs=1e-5)
    pairwise = post(server, path, {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[1:]}).json()
    expected = torch.sigmoid(reference_logits(folder, DOCUMENTS[1], DOCUMENTS[2]))[0]
    assert pairwise["data"][1]["score"] == pytest.approx(float(expected), abs=1e-5)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_documents_by_transformers_scores(encoders, path):
    server, folder = encoders["scorer"]
    response = post(server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = {
        i: float(torch.sigmoid(reference_logits(folder, QUERY, d))[0])
        for i, d in enumerate(DOCUMENTS)
    }
    ranked = sorted(expected, key=expected.get, reverse=True)[:2]
    assert [r["index"] for r in body["results"]] == ranked
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
        assert result["document"]["text"] == DOCUMENTS[result["index"]]
    assert body["usage"]["total_tokens"] > 0


def test_classify_equals_transformers(encoders):
    server, folder = encoders["classifier"]
    response = post(server, "/classify", {"model": "classifier", "input": DOCUMENTS})
    assert response.status_code == 200, response.text
    for data, document in zip(response.json()["data"], DOCUMENTS, strict=True):
        expected = torch.softmax(reference_logits(folder, document), dim=-1)
        assert data["probs"] == pytest.approx(expected.tolist(), abs=1e-5)
        assert data["num_classes"] == 3
        assert data["label"] == LABELS[int(torch.argmax(expected))]


def test_invocations_routes_cross_encoder_payloads(encoders):
    server, _ = encoders["scorer"]
    scored = post(server, "/invocations", {"text_1": QUERY, "text_2": DOCUMENTS[0]}).json()
    direct = post(server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[0]}).json()
    assert scored["data"] == direct["data"]
    reranked = post(server, "/invocations", {"query": QUERY, "documents": DOCUMENTS}).json()
    assert len(reranked["results"]) == 3


def test_wrong_routes_and_shapes_are_400(encoders, main_server, auth_headers):
    scorer, _ = encoders["scorer"]
    classifier, _ = encoders["classifier"]
    assert post(scorer, "/v1/completions", {"prompt": "x"}).status_code == 400
    assert post(scorer, "/score", {"text_1": ["a", "b"], "text_2": ["c"]}).status_code == 400
    assert post(classifier, "/score", {"text_1": "a", "text_2": "b"}).status_code == 400
    on_generator = httpx.post(
        f"{main_server.url}/score",
        json={"text_1": "a", "text_2": "b"},
        headers=auth_headers,
        timeout=30,
    )
    assert on_generator.status_code == 400
    assert "cross-encoder" in on_generator.json()["error"]["message"]
