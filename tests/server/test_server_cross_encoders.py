"""/score, /v1/score, /rerank (v1, v2), /classify on tiny cross-encoders made here (random
weights, tokenizers trained here), equal to transformers' outputs: BertForSequenceClassification
(pairs ``[CLS] a [SEP] b [SEP]`` with token types), XLMRobertaForSequenceClassification
(``<s> a </s></s> b </s>``), Qwen3ForSequenceClassification, and the original Qwen3-Reranker
causal LM under vLLM's --hf-overrides recipe."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from infernetes.runtime.testing import make_tiny_model

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


def make_xlm_roberta_cross_encoder(directory, seed: int):
    """A tiny XLMRobertaForSequenceClassification whose tokenizer writes pairs as RoBERTa's does
    (``<s> a </s></s> b </s>``, no token types) with XLM-R's special ids (pad 1)."""
    import transformers
    from infernetes.runtime.testing import _CORPUS
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    hf_tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_input_names=["input_ids", "attention_mask"],
    )
    hf_tokenizer.save_pretrained(str(directory))
    config = transformers.XLMRobertaConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=130,  # 128 positions after the padding index, as XLM-R's 514
        type_vocab_size=1,
        initializer_range=0.2,
        num_labels=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    config.architectures = ["XLMRobertaForSequenceClassification"]
    torch.manual_seed(seed)
    transformers.XLMRobertaForSequenceClassification(config).eval().save_pretrained(str(directory))
    return directory


# The tiny tokenizer has no "no"/"yes" tokens: two of its own stand in for them.
QWEN3_RERANKER_TOKENS = ["\u0120is", "\u0120the"]
QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": QWEN3_RERANKER_TOKENS,
    "is_original_qwen3_reranker": True,
}


def make_qwen3_seq_cls(directory, seed: int):
    """A tiny transformers Qwen3ForSequenceClassification (one label), as the converted
    ``*-seq-cls`` rerankers are saved."""
    import transformers
    from infernetes.runtime.testing import make_tiny_model

    make_tiny_model(directory, "Qwen3ForCausalLM", seed=seed)
    config = transformers.AutoConfig.from_pretrained(str(directory))
    config.num_labels = 1
    config.architectures = ["Qwen3ForSequenceClassification"]
    torch.manual_seed(seed)
    model = transformers.Qwen3ForSequenceClassification(config).eval()
    for name in list(directory.glob("*.safetensors*")):
        name.unlink()
    model.save_pretrained(str(directory))
    return directory


def qwen3_reranker_reference(directory, first: str, second: str) -> float:
    """The Qwen3-Reranker model card's score: at the last position, the softmax over the "no"
    and "yes" logits of the causal LM, "yes"'s share."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(directory)).eval()
    no, yes = tokenizer.convert_tokens_to_ids(QWEN3_RERANKER_TOKENS)
    with torch.no_grad():
        logits = model(**tokenizer(first, second, return_tensors="pt")).logits[0, -1]
    return float(torch.softmax(logits[[no, yes]], dim=-1)[1])


def reference_logits(directory, *texts) -> torch.Tensor:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        return model(**tokenizer(*texts, return_tensors="pt")).logits[0]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory, server_process_factory):
    root = tmp_path_factory.mktemp("cross-encoders")
    scorer = make_cross_encoder(root / "scorer", 1, seed=1)
    classifier = make_cross_encoder(root / "classifier", 3, seed=2)
    xlm_roberta = make_xlm_roberta_cross_encoder(root / "xlm-roberta", seed=3)
    qwen3_reranker = make_tiny_model(
        root / "qwen3-reranker", "Qwen3ForCausalLM", seed=4, tie_word_embeddings=True
    )  # tied, as Qwen3-Reranker-0.6B: no lm_head.weight in the checkpoint
    qwen3_seq_cls = make_qwen3_seq_cls(root / "qwen3-seq-cls", seed=5)
    common = ["--dtype", "float32", "--max-model-len", "128"]
    models = {
        "scorer": (scorer, []),
        "classifier": (classifier, ["--task", "classify"]),
        "xlm-roberta": (xlm_roberta, []),
        "qwen3-reranker": (
            qwen3_reranker,
            ["--hf-overrides", json.dumps(QWEN3_RERANKER_OVERRIDES)],
        ),
        "qwen3-seq-cls": (qwen3_seq_cls, []),
    }
    servers = {
        name: server_process_factory(
            [str(folder), "--served-model-name", name, *extra, *common], log_name=f"{name}.log"
        )
        for name, (folder, extra) in models.items()
    }
    try:
        for server in servers.values():  # they load at once
            server.wait_ready()
        yield {name: (servers[name], folder) for name, (folder, _) in models.items()}
    finally:
        for server in servers.values():
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


@pytest.mark.parametrize("model", ["xlm-roberta", "qwen3-seq-cls"])
def test_sequence_classification_rerankers_equal_transformers(encoders, model):
    server, folder = encoders[model]
    response = post(server, "/v1/score", {"model": model, "text_1": QUERY, "text_2": DOCUMENTS})
    assert response.status_code == 200, response.text
    for data, document in zip(response.json()["data"], DOCUMENTS, strict=True):
        expected = torch.sigmoid(reference_logits(folder, QUERY, document))[0]
        assert data["score"] == pytest.approx(float(expected), abs=1e-5)
    reranked = post(server, "/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()
    expected = {
        i: float(torch.sigmoid(reference_logits(folder, QUERY, d))[0])
        for i, d in enumerate(DOCUMENTS)
    }
    assert [r["index"] for r in reranked["results"]] == sorted(
        expected, key=expected.get, reverse=True
    )


def test_original_qwen3_reranker_scores_yes_over_no(encoders):
    """The causal-LM Qwen3-Reranker under vLLM's --hf-overrides recipe: its score is the model
    card's P(yes) from the LM head, computed by transformers' causal LM."""
    server, folder = encoders["qwen3-reranker"]
    response = post(server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    assert response.status_code == 200, response.text
    for data, document in zip(response.json()["data"], DOCUMENTS, strict=True):
        expected = qwen3_reranker_reference(folder, QUERY, document)
        assert data["score"] == pytest.approx(expected, abs=1e-5)
    reranked = post(server, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 1})
    best = max(range(3), key=lambda i: qwen3_reranker_reference(folder, QUERY, DOCUMENTS[i]))
    assert [r["index"] for r in reranked.json()["results"]] == [best]


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


def test_classify_equals_transformers(encoders, maps_torch):
    server, folder = encoders["classifier"]
    response = post(server, "/classify", {"model": "classifier", "input": DOCUMENTS})
    assert response.status_code == 200, response.text
    for data, document in zip(response.json()["data"], DOCUMENTS, strict=True):
        expected = torch.softmax(reference_logits(folder, document), dim=-1)
        assert data["probs"] == pytest.approx(expected.tolist(), abs=1e-5)
        assert data["num_classes"] == 3
        assert data["label"] == LABELS[int(torch.argmax(expected))]
    assert not maps_torch(server.process.pid)  # probabilities in numpy, logits as numpy


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
