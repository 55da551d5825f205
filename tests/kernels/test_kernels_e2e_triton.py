"""The engine end to end on the Triton kernels (interpreted on a CPU): greedy generation equals
transformers token for token on tiny models (Llama; Qwen3 with its q/k RMSNorm; DeepSeek-V3's
latent attention; Mistral's sliding window with the blocks behind it given back and taken by
other requests), through prefill, chunked prefill mixed with decodes, and a prefix-cache hit."""

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


def test_triton_sliding_window_over_released_blocks_matches_transformers(tmp_path, triton_attn):
    # Four prompts of 3+ windows in 24 blocks: the blocks behind each window go back to the
    # pool and hold other requests' keys while the first request's table still names them.
    path = str(make_tiny_model(tmp_path, "MistralForCausalLM", sliding_window=16))
    llm = LLM(
        path,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=24,
        block_size=8,
        max_num_batched_tokens=32,
    )
    long = " ".join(SAMPLE_PROMPTS)
    prompts = [long, long[7:], long[13:], long[21:]]
    assert all(len(llm.get_tokenizer()(p).input_ids) > 48 for p in prompts)
    _assert_matches_transformers(llm, path, prompts, llm.generate(prompts, GREEDY))


def test_triton_greedy_qwen3_matches_transformers(tmp_path, triton_attn):
    path = str(make_tiny_model(tmp_path, "Qwen3ForCausalLM"))
    llm = LLM(path, dtype="float32", max_model_len=128, num_gpu_blocks_override=32, block_size=8)
    prompts = SAMPLE_PROMPTS[1:2]
    _assert_matches_transformers(llm, path, prompts, llm.generate(prompts, GREEDY))


def test_triton_deepseek_latent_attention_matches_transformers(tmp_path, triton_attn):
    """MLA on the Triton kernels: one latent "KV head" of 40 (not a power of two) per token,
    the value its first 32 entries, 20 query heads attending in calls of 16 and 4; chunked
    prefill mixed with decodes."""
    path = str(
        make_tiny_model(
            tmp_path, "DeepseekV3ForCausalLM", num_attention_heads=20, num_key_value_heads=20
        )
    )
    llm = LLM(
        path,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=32,
        block_size=8,
        max_num_batched_tokens=8,
    )
    prompts = SAMPLE_PROMPTS[:2]
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


def test_triton_lora_batch_mixing_adapters_matches_peft(
    tiny_llama, triton_attn, tmp_path, monkeypatch
):
    """The LoRA layers on the Triton shrink/expand kernels, in a chunked batch mixing two adapters
    (attention only; MLP with rslora) and the base model."""
    from infernetes.kernels import triton_backend
    from infernetes.runtime.lora.request import LoRARequest
    from infernetes.runtime.testing import hf_peft_greedy_tokens, make_tiny_lora

    launches = []
    shrink = triton_backend.lora_shrink
    monkeypatch.setattr(
        triton_backend, "lora_shrink", lambda *args: launches.append(1) or shrink(*args)
    )

    attn = make_tiny_lora(tiny_llama, tmp_path / "attn", rank=8, seed=1)
    mlp = make_tiny_lora(
        tiny_llama,
        tmp_path / "mlp",
        rank=4,
        use_rslora=True,
        target_modules=["gate_proj", "up_proj", "down_proj"],
        seed=2,
    )
    loras = [LoRARequest("attn", 1, str(attn)), LoRARequest("mlp", 2, str(mlp)), None]
    llm = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        block_size=8,
        max_num_batched_tokens=16,
        enable_lora=True,
        max_loras=2,
    )
    prompts = [[1, 5, 9, 200, 17, 3, 44, 8, 91, 12], [1, 77, 4, 150, 6], [1, 8, 8, 31, 2]]
    outputs = llm.generate(prompts, GREEDY, lora_request=loras)
    assert launches  # the Triton kernels ran, not the reference
    for prompt, lora, output in zip(prompts, loras, outputs, strict=True):
        expected = (
            hf_greedy_tokens(tiny_llama, prompt, GREEDY.max_tokens)
            if lora is None
            else hf_peft_greedy_tokens(tiny_llama, lora.lora_path, prompt, GREEDY.max_tokens)
        )
        assert output.outputs[0].token_ids == expected, lora
