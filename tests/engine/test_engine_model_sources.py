"""Where the model and tokenizer come from: a Hugging Face cache in --download-dir (read offline
here), --tokenizer at its own --tokenizer-revision, --tokenizer-mode, --model-impl."""

from __future__ import annotations

import json
import shutil

import pytest
from infernetes.runtime.engine.engine_config import resolve_config

from infernetes.schema.config import build_config

MAIN, TAGGED = "a" * 40, "b" * 40


@pytest.fixture
def hub_cache(tiny_llama, tmp_path, monkeypatch):
    """A hub cache holding ``acme/tiny`` at two commits: main, and tag ``v2`` whose tokenizer has
    a model_max_length of 77."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / "models--acme--tiny"
    for commit, ref in ((MAIN, "main"), (TAGGED, "v2")):
        snapshot = repo / "snapshots" / commit
        shutil.copytree(tiny_llama, snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    tokenizer_config = repo / "snapshots" / TAGGED / "tokenizer_config.json"
    tokenizer_config.write_text(
        json.dumps({**json.loads(tokenizer_config.read_text()), "model_max_length": 77})
    )
    return tmp_path / "hub"


def test_download_dir_and_tokenizer_revision(hub_cache):
    config, tokenizer = resolve_config(
        build_config("acme/tiny", download_dir=str(hub_cache), device="cpu"), environ={}
    )
    assert config.model.info.path.name == MAIN
    assert tokenizer.model_max_length != 77
    tagged, tagged_tokenizer = resolve_config(
        build_config(
            "acme/tiny",
            download_dir=str(hub_cache),
            tokenizer="acme/tiny",
            tokenizer_revision="v2",
            device="cpu",
        ),
        environ={},
    )
    assert tagged.model.info.path.name == MAIN and tagged_tokenizer.model_max_length == 77


def test_without_download_dir_the_cache_is_not_found(hub_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(Exception, match="acme/tiny"):
        resolve_config(build_config("acme/tiny", device="cpu"), environ={})


def test_tokenizer_mode_slow_asks_transformers_for_a_slow_tokenizer(tiny_llama, monkeypatch):
    import transformers

    asked = {}
    original = transformers.AutoTokenizer.from_pretrained

    def spy(name, **kwargs):
        asked.update(kwargs)
        return original(name, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    resolve_config(build_config(tiny_llama, tokenizer_mode="slow", device="cpu"), environ={})
    assert asked["use_fast"] is False
    resolve_config(build_config(tiny_llama, device="cpu"), environ={})
    assert asked["use_fast"] is True


def test_model_impl_picks_the_native_implementation_or_the_transformers_fallback(tiny_llama):
    for impl, implementation in (
        ("vllm", "native"),
        ("auto", "native"),
        ("transformers", "transformers"),
    ):
        config, _ = resolve_config(
            build_config(tiny_llama, model_impl=impl, device="cpu"), environ={}
        )
        assert config.model.info.architecture == "LlamaForCausalLM"
        assert config.model.info.implementation == implementation
