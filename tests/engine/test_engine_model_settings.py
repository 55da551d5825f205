"""Model and load settings the engine honours at startup: --attention-backend, --hf-config-path,
--config-format, --ignore-patterns and --disable-sliding-window."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from infernetes.kernels import backend
from infernetes.runtime.model_executor.loader import ModelLoadError, weight_files
from infernetes.runtime.testing import SAMPLE_PROMPTS, make_tiny_model

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
SMALL = dict(
    dtype="float32", max_model_len=128, num_gpu_blocks_override=32, block_size=8, device="cpu"
)
DERIVED_LEN = dict(
    dtype="float32", num_gpu_blocks_override=64, block_size=8, device="cpu"
)  # 512 tokens


def _tokens(llm: LLM) -> list[int]:
    return llm.generate(SAMPLE_PROMPTS[1], GREEDY)[0].outputs[0].token_ids


@pytest.fixture(autouse=True)
def _flag_reset():
    yield
    backend.select_backend(None)  # an engine's --attention-backend stays with its process


def test_attention_backend_flag_overrides_the_variable(tiny_llama, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")  # cannot run on a CPU without it
    llm = LLM(tiny_llama, attention_backend="TORCH_SDPA", **SMALL)
    assert backend.attention_backend("cpu") == backend.TORCH_SDPA
    assert len(_tokens(llm)) == 4


def test_unavailable_attention_backend_fails_before_the_model_loads(tiny_llama, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(
        backend.BackendError, match="--attention-backend TRITON_ATTN needs a CUDA device"
    ):
        LLM(tiny_llama, attention_backend="TRITON_ATTN", **SMALL)


def _copy(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_hf_config_path_reads_config_json_from_another_folder(tiny_llama, tmp_path):
    model = _copy(tiny_llama, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    assert LLM(str(model), **DERIVED_LEN).llm_engine.max_model_len == 64  # its own config.json
    for source in (tiny_llama, str(Path(tiny_llama) / "config.json")):  # a folder or the file
        llm = LLM(str(model), hf_config_path=source, **DERIVED_LEN)
        assert llm.llm_engine.max_model_len == 512
        assert len(_tokens(llm)) == 4


def test_config_format_hf_is_honoured_and_mistral_refused(tiny_llama, tmp_path):
    assert len(_tokens(LLM(tiny_llama, config_format="hf", **SMALL))) == 4
    with pytest.raises(ValueError, match="--config-format"):
        LLM(tiny_llama, config_format="mistral", **SMALL)
    params_only = tmp_path / "mistral-format"
    params_only.mkdir()
    (params_only / "params.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"params\.json is Mistral's format"):
        LLM(str(params_only), **SMALL)


def test_ignore_patterns_leave_matching_weight_files_unread(tiny_llama, tmp_path):
    model = _copy(tiny_llama, tmp_path / "model")
    (model / "consolidated.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match=r"consolidated\.safetensors"):
        LLM(str(model), **SMALL)
    assert len(_tokens(LLM(str(model), ignore_patterns=["consolidated*"], **SMALL))) == 4


def test_ignore_patterns_default_and_fallback(tmp_path):
    (tmp_path / "original").mkdir()
    for name in (
        "model.safetensors",
        "extra.safetensors",
        "original/consolidated.safetensors",
        "model.bin",
    ):
        (tmp_path / name).write_bytes(b"")
    assert weight_files(tmp_path, "auto") == [
        tmp_path / "extra.safetensors",
        tmp_path / "model.safetensors",
    ]
    assert weight_files(tmp_path, "auto", ["extra.*"]) == [tmp_path / "model.safetensors"]
    assert weight_files(tmp_path, "auto", ["*.safetensors"]) == [
        tmp_path / "model.bin"
    ]  # as if absent
    with pytest.raises(ModelLoadError, match=r"ignoring \*"):
        weight_files(tmp_path, "auto", ["*"])


@pytest.fixture(scope="module")
def sliding_mistral(tmp_path_factory):
    return str(
        make_tiny_model(tmp_path_factory.mktemp("sliding"), "MistralForCausalLM", sliding_window=64)
    )


def test_sliding_window_model_serves_its_whole_context(sliding_mistral):
    assert LLM(sliding_mistral, **DERIVED_LEN).llm_engine.max_model_len == 512


def test_disable_sliding_window_caps_the_context_at_the_window(sliding_mistral, hf_greedy):
    llm = LLM(sliding_mistral, disable_sliding_window=True, **DERIVED_LEN)
    assert llm.llm_engine.max_model_len == 64
    prompt_ids = llm.llm_engine.tokenizer(SAMPLE_PROMPTS[1]).input_ids
    assert _tokens(llm) == hf_greedy(sliding_mistral, prompt_ids, 4)  # within the window: the same
    with pytest.raises(
        ModelLoadError, match=r"64 tokens \(its sliding window, with --disable-sliding-window\)"
    ):
        LLM(sliding_mistral, disable_sliding_window=True, max_model_len=128, **DERIVED_LEN)


def test_sliding_window_switched_off_in_the_config_changes_nothing(model_factory):
    path = model_factory("Qwen2ForCausalLM", sliding_window=64, use_sliding_window=False)
    assert LLM(path, **SMALL).llm_engine.max_model_len == 128
