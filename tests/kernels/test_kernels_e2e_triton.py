"""The engine end to end on the Triton kernels (interpreted on a CPU): greedy generation equals
transformers token for token on tiny models (Llama; Qwen3 with its q/k RMSNorm), through prefill,
chunked prefill mixed with decodes, and a prefix-cache hit."""

import pytest
import torch
from infernetes.kernels import backend
from infernetes.runtime.testing import (
    SAMPLE_PROMPTS,
    hf_greedy_tokens,
    make_tiny_llama,
    make_tiny_model,
)

from infernetes import LLM, SamplingParams

pytest.importorskip("triton")  # no Triton wheels outside Linux

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture
def triton_attn(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    # the engine runs on the GPU where there is one (compiled kernels), else interpreted on the CPU
    assert (
        backend.attention_backend("cuda" if torch.cuda.is_available() else "cpu")
        == backend.TRITON_ATTN
    )


def _assert_matches_transformers(llm: LLM, path: str, prompts: list[str], outputs) -> None:
    tokenizer = llm.get_tokenizer()
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = tokenizer(prompt).input_ids
        assert output.outputs[0].token_ids == hf_greedy_tokens(path, ids, GREEDY.max_tokens), prompt


def test_triton_greedy_batch_with_chunked_prefill_matches_transformers(tiny_llama, triton_attn):
    # A budget of 8 tokens per step chunks the prompts and mixes them with decodes.
    llm = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        block_size=8,
        max_num_batched_tokens=8,
        enable_chunked_prefill=True,
    )
    prompts = SAMPLE_PROMPTS[:3]
    _assert_matches_transformers(llm, tiny_llama, prompts, llm.generate(prompts, GREEDY))


def test_triton_greedy_qwen3_matches_transformers(tmp_path, triton_attn):
    path = str(make_tiny_model(tmp_path, "Qwen3ForCausalLM"))
    llm = LLM(path, dtype="float32", max_model_len=128, num_gpu_blocks_override=32, block_size=8)
    prompts = SAMPLE_PROMPTS[1:2]
    _assert_matches_transformers(llm, path, prompts, llm.generate(prompts, GREEDY))


def test_triton_prefix_cache_hit_matches_transformers(tiny_llama, triton_attn):
    llm = LLM(
        tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8
    )
    shared = SAMPLE_PROMPTS[3]
    first = llm.generate(shared + " One", GREEDY)
    second = llm.generate(shared + " Two", GREEDY)
    assert second[0].num_cached_tokens >= 16
    _assert_matches_transformers(
        llm, tiny_llama, [shared + " One", shared + " Two"], first + second
    )


def test_triton_fp8_kv_cache_generates_like_the_reference(tiny_llama, monkeypatch):
    prompts = SAMPLE_PROMPTS[:2]
    results = {}
    for name in (backend.TORCH_SDPA, backend.TRITON_ATTN):
        monkeypatch.setenv("VLLM_ATTENTION_BACKEND", name)
        llm = LLM(
            tiny_llama,
            dtype="float32",
            max_model_len=128,
            num_gpu_blocks_override=32,
            block_size=8,
            kv_cache_dtype="fp8",
        )
        results[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert results[backend.TRITON_ATTN] == results[backend.TORCH_SDPA]
