"""Qwen3-VL-MoE on the CPU: greedy tokens and logprobs equal transformers' for images batched
with text, whole and under chunked prefill (the experts through the fused MoE, DeepStack into
the first layers); its fused expert tensors load from transformers 5's layout and the Hub's
(each ``[experts, in, out]``); across tensor and pipeline ranks."""

from __future__ import annotations

import shutil

import pytest
from infernetes.runtime.testing_vision import (
    QWEN_IMAGE,
    assert_equals_transformers,
    hf_llava_greedy,
    make_tiny_qwen2_vl,
    random_image,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=192, num_gpu_blocks_override=96, block_size=8)
CASES = [
    (f"Describe {QWEN_IMAGE} please.", [(1, (70, 50))]),
    (f"Compare {QWEN_IMAGE} with {QWEN_IMAGE}", [(2, (40, 36)), (3, (30, 90))]),
    ("Hello world, what is the capital of France?", []),
]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return str(make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen3_vl_moe"), version="3-moe"))


def _images(seeds: list) -> list:
    return [random_image(seed, size) for seed, size in seeds]


def _prompts() -> list:
    return [
        {"prompt": text, "multi_modal_data": {"image": _images(seeds)}} if seeds else text
        for text, seeds in CASES
    ]


@pytest.fixture(scope="module")
def expected(qwen):
    return [hf_llava_greedy(qwen, text, _images(seeds), MAX_TOKENS) for text, seeds in CASES]


@pytest.mark.parametrize("budget", [None, 8])
def test_images_equal_transformers_batched_with_text(qwen, expected, budget):
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(qwen, **ENGINE, **chunking, enable_chunked_prefill=True)
    assert_equals_transformers(llm.generate(_prompts(), GREEDY), expected)


def test_the_hubs_expert_layout_loads_the_same_model(qwen, expected, tmp_path):
    import safetensors.torch

    hub = tmp_path / "hub"
    shutil.copytree(qwen, hub)
    weights = safetensors.torch.load_file(str(hub / "model.safetensors"))
    fused = [name for name in weights if name.endswith(("experts.gate_up_proj", "down_proj"))]
    assert fused
    for name in fused:
        weights[name] = weights[name].transpose(1, 2).contiguous()
    safetensors.torch.save_file(weights, str(hub / "model.safetensors"), {"format": "pt"})
    llm = LLM(str(hub), **ENGINE)
    assert_equals_transformers(llm.generate(_prompts(), GREEDY), expected)


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_images_across_ranks(qwen, expected, tp, pp):
    llm = LLM(
        qwen,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    assert_equals_transformers(llm.generate(_prompts(), GREEDY), expected)
