"""Model-dependent defaults from a local config.json (a folder or the Hugging Face cache)."""

import json

import pytest

from infernetes.schema.config import ConfigError, build_config
from infernetes.schema.model_info import (
    derived_max_model_len,
    find_config_json,
    resolve_dtype_name,
    resolve_model_defaults,
)


def write_model(folder, **config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


GPU = ("cuda", False)


def test_resolves_from_a_local_folder(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=2048, torch_dtype="bfloat16")
    config = resolve_model_defaults(build_config(str(model)), environ={}, host=GPU)
    assert (config.max_model_len, config.dtype) == (2048, "bfloat16")


def test_without_the_host_the_dtype_stays_auto(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=128, torch_dtype="bfloat16")
    assert resolve_model_defaults(build_config(str(model)), environ={}).dtype == "auto"


def test_fp32_models_run_in_fp16_under_auto_on_a_gpu(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=128, torch_dtype="float32")
    assert resolve_model_defaults(build_config(str(model)), environ={}, host=GPU).dtype == "float16"


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


def test_explicit_values_are_kept(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=2048, torch_dtype="bfloat16")
    config = resolve_model_defaults(
        build_config(str(model), max_model_len=1024, dtype="float32"), environ={}
    )
    assert (config.max_model_len, config.dtype) == (1024, "float32")


def test_too_long_max_model_len_is_an_error_unless_allowed(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=2048)
    config = build_config(str(model), max_model_len=4096)
    with pytest.raises(ConfigError, match="--max-model-len"):
        resolve_model_defaults(config, environ={})
    allowed = resolve_model_defaults(config, environ={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert allowed.max_model_len == 4096


def test_resolves_from_the_hugging_face_cache(tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    write_model(repo / "snapshots" / "abc123", n_positions=1024)
    config = build_config("org/tiny")
    assert find_config_json(config, {"HF_HUB_CACHE": str(tmp_path / "hub")}) is not None
    assert resolve_model_defaults(config, environ={"HF_HOME": str(tmp_path)}).max_model_len == 1024


def test_unresolvable_models_stay_auto(tmp_path):
    config = build_config("org/not-downloaded")
    assert resolve_model_defaults(config, environ={"HF_HOME": str(tmp_path)}) == config


def test_context_length_rules():
    assert derived_max_model_len({"max_position_embeddings": 4096, "seq_length": 2048}) == 2048
    assert (
        derived_max_model_len(
            {
                "max_position_embeddings": 4096,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            }
        )
        == 8192
    )
    assert derived_max_model_len({"text_config": {"max_position_embeddings": 512}}) == 512
    assert derived_max_model_len({}) is None
    # RoBERTa numbers positions after the padding index: XLM-R's 514 embeddings hold 512 tokens
    roberta = {"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}
    assert derived_max_model_len(roberta) == 512


def test_hf_overrides_apply_before_deriving(tmp_path):
    model = write_model(tmp_path / "tiny", max_position_embeddings=2048)
    config = build_config(str(model), hf_overrides={"max_position_embeddings": 8192})
    assert resolve_model_defaults(config, environ={}).max_model_len == 8192


def test_the_checkpoint_decides_the_quantization_method(tmp_path):
    gptq = write_model(tmp_path / "gptq", quantization_config={"quant_method": "gptq", "bits": 4})
    assert resolve_model_defaults(build_config(str(gptq)), environ={}).quantization == "gptq"
    marlin = build_config(str(gptq), quantization="gptq_marlin")  # vLLM's kernel for the format
    assert resolve_model_defaults(marlin, environ={}).quantization == "gptq"
    with pytest.raises(ConfigError, match="--quantization awq contradicts the checkpoint"):
        resolve_model_defaults(build_config(str(gptq), quantization="awq"), environ={})
    legacy = write_model(tmp_path / "legacy", max_position_embeddings=128)
    (legacy / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    assert resolve_model_defaults(build_config(str(legacy)), environ={}).quantization == "gptq"
    plain = write_model(tmp_path / "plain", max_position_embeddings=128)
    assert resolve_model_defaults(build_config(str(plain), quantization="fp8"), environ={})
    with pytest.raises(ConfigError, match="needs a checkpoint quantized with awq"):
        resolve_model_defaults(build_config(str(plain), quantization="awq_marlin"), environ={})
    other = write_model(tmp_path / "bnb", quantization_config={"quant_method": "bitsandbytes"})
    with pytest.raises(ConfigError, match=r"'bitsandbytes' .* not supported; supported: awq"):
        resolve_model_defaults(build_config(str(other)), environ={})
