"""Model and load settings the engine honours at startup: --attention-backend, --hf-config-path,
--config-format, --ignore-patterns and --disable-sliding-window."""

from __future__ import annotations

import pytest
from infernetes.kernels import backend
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
SMALL = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=32, block_size=8, device="cpu")


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
    with pytest.raises(backend.BackendError, match="--attention-backend TRITON_ATTN needs a CUDA device"):
        LLM(tiny_llama, attention_backend="TRITON_ATTN", **SMALL)
