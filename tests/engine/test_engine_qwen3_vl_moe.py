"""Qwen3-VL-MoE's fused expert tensors load from the Hub's layout (each ``[experts, in, out]``)
as from transformers 5's (``[experts, out, in]``): the same greedy tokens and logprobs as
transformers'. The rest of its tests are Qwen2-VL's (``test_engine_qwen2_vl.py``)."""

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
