"""Model loading options and bad input: each failure names the problem."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from infernetes.runtime.testing import SAMPLE_PROMPTS, make_tiny_model

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SMALL = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=32, block_size=8)


def _tokens(llm, prompt=SAMPLE_PROMPTS[1], params=GREEDY):
    return llm.generate(prompt, params)[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def reference_tokens(tiny_llama):
    return _tokens(LLM(tiny_llama, **SMALL))


def _copy(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_sharded_safetensors_with_index(tmp_path, reference_tokens):
    path = make_tiny_model(tmp_path / "sharded", max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    assert _tokens(LLM(str(path), **SMALL)) == reference_tokens


def test_pytorch_bin_fallback_and_load_formats(tmp_path, tiny_llama, reference_tokens):
    from safetensors.torch import load_file

    path = _copy(tiny_llama, tmp_path / "bin")
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    torch.save(state, path / "pytorch_model.bin")
    assert _tokens(LLM(str(path), **SMALL)) == reference_tokens
    assert _tokens(LLM(str(path), load_format="pt", **SMALL)) == reference_tokens
    with pytest.raises(ValueError, match=r"no \*\.safetensors weights"):
        LLM(str(path), load_format="safetensors", **SMALL)
    dummy = LLM(str(path), load_format="dummy", **SMALL)
    assert len(_tokens(dummy)) == 8


def test_corrupt_safetensors_is_named(tmp_path, tiny_llama):
    path = _copy(tiny_llama, tmp_path / "corrupt")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"cannot read weights from .*model\.safetensors"):
        LLM(str(path), **SMALL)


def test_unknown_architecture_and_remote_code(tmp_path, tiny_llama):
    path = _copy(tiny_llama, tmp_path / "unknown")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(
        json.dumps({**config, "architectures": ["FancyNewForCausalLM"]})
    )
    with pytest.raises(ValueError, match=r"FancyNewForCausalLM.*not supported.*LlamaForCausalLM"):
        LLM(str(path), **SMALL)
    remote = {
        **config,
        "architectures": ["FancyNewForCausalLM"],
        "auto_map": {"AutoConfig": "x.Config"},
    }
    (path / "config.json").write_text(json.dumps(remote))
    with pytest.raises(ValueError, match="trust-remote-code"):
        LLM(str(path), **SMALL)


def test_max_model_len_checked_against_the_model(tiny_llama, monkeypatch):
    with pytest.raises(ValueError, match=r"max_model_len=4096 is longer than .* 512"):
        LLM(tiny_llama, dtype="float32", max_model_len=4096, num_gpu_blocks_override=512)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    llm = LLM(tiny_llama, dtype="float32", max_model_len=4096, num_gpu_blocks_override=512)
    assert llm.llm_engine.max_model_len == 4096
    default = LLM(tiny_llama, dtype="float32", num_gpu_blocks_override=64)
    assert default.llm_engine.max_model_len == 512  # from config.json


def test_hf_overrides_replace_values_and_merge_dicts(tmp_path, tiny_llama):
    from infernetes.runtime.model_executor.loader import load_hf_config

    llm = LLM(
        tiny_llama,
        dtype="float32",
        num_gpu_blocks_override=64,
        hf_overrides={"max_position_embeddings": 64},
    )
    assert llm.llm_engine.max_model_len == 64  # derived from the overridden config
    with pytest.raises(ValueError, match="maximum model length of 64"):
        llm.generate([list(range(3, 70))], GREEDY)
    path = _copy(tiny_llama, tmp_path / "scaled")
    config = json.loads((path / "config.json").read_text())
    scaling = {"rope_type": "linear", "factor": 2.0}
    (path / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
    merged = load_hf_config(
        path, hf_overrides={"rope_scaling": {"factor": 4.0}, "rms_norm_eps": 1e-3}
    )
    assert merged.rope_scaling["rope_type"] == "linear" and merged.rope_scaling["factor"] == 4.0
    assert merged.rms_norm_eps == 1e-3


def test_hf_overrides_rope_theta_reaches_the_model(tiny_llama):
    """transformers 5 reads the base from ``rope_parameters``: an override of ``rope_theta``
    must land there, or it changes nothing (as it did)."""
    from infernetes.runtime.model_executor.loader import load_hf_config

    config = load_hf_config(Path(tiny_llama), hf_overrides={"rope_theta": 1234.0})
    params = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    assert params["rope_theta"] == 1234.0
    prompt = [list(range(3, 40))]
    base = LLM(tiny_llama, dtype="float32", num_gpu_blocks_override=64).generate(prompt, GREEDY)
    moved = LLM(
        tiny_llama,
        dtype="float32",
        num_gpu_blocks_override=64,
        hf_overrides={"rope_theta": 1234.0},
    ).generate(prompt, GREEDY)
    assert base[0].outputs[0].token_ids != moved[0].outputs[0].token_ids


def test_kv_cache_smaller_than_one_sequence_is_refused(tiny_llama):
    with pytest.raises(ValueError, match=r"max seq len \(128\) is larger than .* KV cache \(64\)"):
        LLM(tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=8, block_size=8)


def test_cpu_kv_cache_space_and_memory_bytes(tiny_llama, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = LLM(tiny_llama, dtype="float32", max_model_len=128)
    engine = llm.llm_engine.engine_core
    assert (
        engine.num_blocks == (1 << 30) // engine.executor.driver_worker.model_runner.bytes_per_block
    )
    by_bytes = LLM(tiny_llama, dtype="float32", max_model_len=128, kv_cache_memory_bytes=1 << 20)
    assert (
        by_bytes.llm_engine.engine_core.num_blocks
        == (1 << 20)
        // by_bytes.llm_engine.engine_core.executor.driver_worker.model_runner.bytes_per_block
    )


def test_generation_config_defaults_and_overrides(tmp_path):
    path = make_tiny_model(
        tmp_path / "gen", generation_config={"temperature": 0.0, "max_new_tokens": 5}
    )
    llm = LLM(str(path), **SMALL)
    defaults = llm.get_default_sampling_params()
    assert defaults.temperature == 0.0 and defaults.max_tokens == 5
    [output] = llm.generate(SAMPLE_PROMPTS[0])
    assert len(output.outputs[0].token_ids) <= 5
    overridden = LLM(str(path), override_generation_config={"max_new_tokens": 3}, **SMALL)
    assert overridden.get_default_sampling_params().max_tokens == 3
    ignored = LLM(str(path), generation_config="vllm", **SMALL)
    assert ignored.get_default_sampling_params().max_tokens == 16


def test_skip_tokenizer_init_takes_token_ids(tiny_llama, reference_tokens):
    llm = LLM(tiny_llama, skip_tokenizer_init=True, **SMALL)
    ids = LLM(tiny_llama, **SMALL).get_tokenizer()(SAMPLE_PROMPTS[1]).input_ids
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    [output] = llm.generate([ids], params)
    assert output.outputs[0].token_ids == reference_tokens and output.outputs[0].text == ""
    with pytest.raises(ValueError, match="needs a tokenizer"):
        llm.generate("text", params)


def test_fp8_kv_cache_and_sha256_prefix_hashing(tiny_llama, reference_tokens):
    for kv_dtype in ("fp8", "fp8_e5m2"):
        llm = LLM(tiny_llama, kv_cache_dtype=kv_dtype, calculate_kv_scales=True, **SMALL)
        layer = llm.llm_engine.engine_core.executor.driver_worker.model_runner.attention_layers[0]
        assert layer.k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        tokens = _tokens(llm)
        assert len(tokens) == 8
        assert float(layer.k_scale) != 1.0  # measured on the first batch
    hashed = LLM(tiny_llama, prefix_caching_hash_algo="sha256", **SMALL)
    assert _tokens(hashed) == reference_tokens
    [again] = hashed.generate(SAMPLE_PROMPTS[1], GREEDY)
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == reference_tokens


def test_bad_requests_name_the_problem(tiny_llama):
    llm = LLM(tiny_llama, **SMALL)
    cases = [
        (SAMPLE_PROMPTS[0], SamplingParams(max_tokens=500), "maximum context length is 128"),
        (
            list(range(200)),
            SamplingParams(max_tokens=1),
            "longer than the maximum model length of 128",
        ),
        (SAMPLE_PROMPTS[0], SamplingParams(logprobs=50), "greater than the maximum allowed"),
        (SAMPLE_PROMPTS[0], SamplingParams(prompt_logprobs=50), "prompt_logprobs of 50"),
        ([1, 2, 100000], SamplingParams(), "Token id 100000 is out of vocabulary"),
        ({"prompt_token_ids": []}, SamplingParams(), "cannot be empty"),
        (
            SAMPLE_PROMPTS[0],
            SamplingParams(logit_bias={99999: 1.0}),
            "logit_bias contains token id 99999",
        ),
    ]
    for prompt, params, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.generate(prompt, params)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="unknown argument 'not_an_arg'"):
        LLM(tiny_llama, not_an_arg=1)
    # nothing leaked and the engine still serves
    assert llm.llm_engine.engine_core.block_manager.num_free_blocks == 32
    assert _tokens(llm) == _tokens(LLM(tiny_llama, **SMALL))


def test_max_logprobs_minus_one_is_no_cap(tiny_llama):
    llm = LLM(tiny_llama, max_logprobs=-1, **SMALL)
    params = SamplingParams(max_tokens=2, logprobs=20, prompt_logprobs=50)
    [output] = llm.generate(SAMPLE_PROMPTS[0], params)
    assert all(len(top) >= 20 for top in output.outputs[0].logprobs)
    assert all(len(top) >= 50 for top in output.prompt_logprobs[1:])


def test_dtype_rules():
    from types import SimpleNamespace

    from infernetes.runtime.model_executor.loader import cpu_has_fast_bf16, resolve_dtype

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    fp32_model = SimpleNamespace(dtype=torch.float32)
    bf16_model = SimpleNamespace(dtype="bfloat16")
    assert resolve_dtype(fp32_model, "auto", gpu) == torch.float16
    assert resolve_dtype(bf16_model, "auto", gpu) == torch.bfloat16
    assert resolve_dtype(fp32_model, "auto", cpu) == (
        torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    )
    assert resolve_dtype(bf16_model, "half", cpu) == torch.float16
    with pytest.raises(ValueError, match="dtype must be one of auto"):
        resolve_dtype(fp32_model, "float8", cpu)


def test_seed_makes_unseeded_sampling_reproducible(tiny_llama):
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    first = _tokens(LLM(tiny_llama, seed=3, **SMALL), params=params)
    second = _tokens(LLM(tiny_llama, seed=3, **SMALL), params=params)
    assert first == second


def test_missing_model_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="cannot find model 'some-org/some-model'"):
        LLM("some-org/some-model", **SMALL)


def test_separate_tokenizer_folder(tmp_path, tiny_llama, reference_tokens):
    from infernetes.runtime.testing import build_tokenizer

    build_tokenizer(tmp_path / "tok")
    llm = LLM(tiny_llama, tokenizer=str(tmp_path / "tok"), **SMALL)
    assert _tokens(llm) == reference_tokens


def test_fp8_weight_quantization(tiny_llama):
    llm = LLM(tiny_llama, quantization="fp8", **SMALL)
    qkv = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model.model.layers[
        0
    ].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.numel() == 1
    assert len(_tokens(llm)) == 8
    with pytest.raises(ValueError, match="--quantization/-q bitsandbytes is not supported"):
        LLM(tiny_llama, quantization="bitsandbytes", **SMALL)
    with pytest.raises(ValueError, match="--quantization awq needs a checkpoint quantized with"):
        LLM(tiny_llama, quantization="awq", **SMALL)
    with pytest.raises(ValueError, match="--tokenizer-mode custom is not supported"):
        LLM(tiny_llama, tokenizer_mode="custom", **SMALL)


def test_start_up_phases_are_timed_in_the_log(tiny_llama, caplog):
    """Loading the weights and initialising the engine (profile, KV cache, warm-up) each log
    how long they took, as vLLM's do, so a slow start says where the time went."""
    import logging

    with caplog.at_level(logging.INFO, logger="infernetes.runtime"):
        LLM(tiny_llama, dtype="float32", max_model_len=64, kv_cache_memory_bytes=2**22)
    assert re.search(r"Model loading took \d+\.\d\d seconds", caplog.text), caplog.text
    assert re.search(
        r"init engine \(profile, create kv cache, warmup model\) took \d+\.\d\d seconds",
        caplog.text,
    )


def test_a_cpu_engine_builds_every_kernel_before_its_first_step(tmp_path, tiny_llama, monkeypatch):
    # A pod with an empty kernel cache must not compile inside a step, on the step watchdog's
    # time (a cold build on busy cores took over a minute).
    from infernetes.kernels.cpu import native

    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "kernels"))
    native.load.cache_clear()
    try:
        LLM(tiny_llama, **SMALL)  # loads and profiles: no request has run
        built = {path.name.split("-")[0] for path in (tmp_path / "kernels").glob("*.so")}
        assert built == {source.stem for source in native.SOURCE_DIR.glob("*.c")}
    finally:
        native.load.cache_clear()
