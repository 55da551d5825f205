"""The dtype rule and where a model's config.json is on local disk (the rest of what depends on
the model is the engine's ``resolve_config``: tests/engine/test_engine_config_matches_serve.py)."""

import json

import pytest

from infernetes.schema.config import ConfigError, build_config
from infernetes.schema.model_info import find_config_json, resolve_dtype_name


def write_model(folder, **config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("requested", "model_dtype", "device", "fast_bf16", "expected"),
    [
        ("auto", "float32", "cuda", False, "float16"),
        ("auto", "float16", "cuda", False, "float16"),
        ("auto", "bfloat16", "cuda", False, "bfloat16"),
        ("auto", None, "cuda", False, "float16"),
        ("auto", "torch.bfloat16", "cuda", False, "bfloat16"),
        ("auto", "float16", "cpu", True, "bfloat16"),
        ("auto", "float32", "cpu", True, "bfloat16"),
        ("auto", "bfloat16", "cpu", False, "float32"),
        ("half", "bfloat16", "cpu", True, "float16"),
        ("float", "bfloat16", "cuda", False, "float32"),
        ("float32", "float16", "cuda", False, "float32"),
        ("bfloat16", "float32", "cpu", False, "bfloat16"),
        ("float16", "float32", "cpu", False, "float16"),
    ],
)
def test_the_dtype_rule(requested, model_dtype, device, fast_bf16, expected):
    assert resolve_dtype_name(requested, model_dtype, device, fast_bf16) == expected


def test_an_unknown_dtype_names_the_argument():
    with pytest.raises(ConfigError, match="--dtype"):
        resolve_dtype_name("fp8", None, "cuda", False)


def test_finds_the_config_in_a_folder_or_the_hugging_face_cache(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=128)
    assert find_config_json(build_config(str(model)), {}) == model / "config.json"
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    write_model(repo / "snapshots" / "abc123", n_positions=1024)
    config = build_config("org/tiny")
    assert find_config_json(config, {"HF_HUB_CACHE": str(tmp_path / "hub")}) is not None
    assert find_config_json(config, {"HF_HOME": str(tmp_path)}) is not None
    assert find_config_json(build_config("org/not-downloaded"), {"HF_HOME": str(tmp_path)}) is None
