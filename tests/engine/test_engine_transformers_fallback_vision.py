"""The transformers fallback for image-text-to-text models: transformers' vision tower and
projector (``get_image_features``) and its language model on this engine's paged attention give
transformers' greedy tokens and logprobs for one image, two, and text batched with them, whole
and under chunked prefill; the same image hits the prefix cache; what it cannot take is refused
with the reason."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing_vision import (
    assert_equals_transformers,
    hf_llava_greedy,
    make_tiny_aya_vision,
    make_tiny_gemma3,
    make_tiny_llava,
    make_tiny_qwen2_vl,
    random_image,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=192, num_gpu_blocks_override=96, block_size=8)
# Aya Vision's processor cuts an image into tiles by default; the fallback takes one per image
NO_CROPS = {"crop_to_patches": False}

# (prompt, image seeds): one image, two (one repeated), text only
CASES = [
    ("Describe <image> please.", [1]),
    ("Compare <image> with <image> and <image>", [2, 3, 2]),
    ("Hello world, what is the capital of France?", []),
    ("<image>", [4]),
]


def _prompt(text: str, seeds: list[int]) -> dict | str:
    if not seeds:
        return text
    return {"prompt": text, "multi_modal_data": {"image": [random_image(s) for s in seeds]}}


def _model(llm: LLM):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner.model


@pytest.fixture(scope="module")
def aya(tmp_path_factory):
    return str(make_tiny_aya_vision(tmp_path_factory.mktemp("aya")))


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return str(make_tiny_llava(tmp_path_factory.mktemp("llava")))


def _expected(path: str, **processor_kwargs) -> list:
    return [
        hf_llava_greedy(
            path, text, [random_image(s) for s in seeds], MAX_TOKENS, **processor_kwargs
        )
        for text, seeds in CASES
    ]


@pytest.mark.parametrize("budget", [None, 8])
def test_aya_vision_equals_transformers_batched_with_text(aya, budget):
    # no native implementation: auto runs the fallback. A budget of 8 tokens a step cuts each
    # image's 19 placeholder tokens (begin, global tile, 16 patches, end) across chunks.
    chunking = {} if budget is None else dict(max_num_batched_tokens=8, enable_chunked_prefill=True)
    llm = LLM(aya, **ENGINE, **chunking, mm_processor_kwargs=NO_CROPS)
    assert type(_model(llm)).__name__ == "TransformersForImageTextToText"
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, _expected(aya, **NO_CROPS))


def test_llava_forced_through_the_fallback_equals_transformers(llava):
    llm = LLM(
        llava,
        **ENGINE,
        model_impl="transformers",
        max_num_batched_tokens=8,
        enable_chunked_prefill=True,
    )
    assert type(_model(llm)).__name__ == "TransformersForImageTextToText"
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, _expected(llava))


def test_the_same_image_hits_the_prefix_cache(aya):
    llm = LLM(aya, **ENGINE, mm_processor_kwargs=NO_CROPS)
    text = "The quick brown fox jumps over the lazy dog. <image> What is it?"
    image, other = random_image(7), random_image(8)
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [changed] = llm.generate({"prompt": text, "multi_modal_data": {"image": other}}, GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8
    assert changed.num_cached_tokens < again.num_cached_tokens  # only the blocks before it
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    _, tokens, _ = hf_llava_greedy(aya, text, [other], MAX_TOKENS, **NO_CROPS)
    assert changed.outputs[0].token_ids == tokens


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (
            lambda: {"prompt": "a <image>", "multi_modal_data": {"audio": 1}},
            r"multi_modal_data.audio: this model takes image only",
        ),
        (
            lambda: {"prompt": "a", "multi_modal_data": {"video": [random_image(1)]}},
            r"multi_modal_data.video: this model takes image only",
        ),
        (  # its processor's tiles of a wide image are refused, not taken for images
            lambda: {
                "prompt": "a <image>",
                "multi_modal_data": {"image": random_image(1, (80, 30))},
                "mm_processor_kwargs": {"crop_to_patches": True},
            },
            r"made 4 image arrays of 1 image\(s\) \(crops or tiles\).*crop_to_patches: false",
        ),
    ],
)
def test_what_the_fallback_cannot_take_is_refused(aya, prompt, message):
    llm = _aya_llm(aya)
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt(), GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
    [output] = llm.generate(_prompt("Describe <image> please.", [1]), GREEDY)  # still serving
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


_AYA: dict[str, LLM] = {}


def _aya_llm(path: str) -> LLM:
    if path not in _AYA:
        _AYA[path] = LLM(path, **ENGINE, mm_processor_kwargs=NO_CROPS)
    return _AYA[path]


def test_limits_for_modalities_the_fallback_lacks_are_refused_at_startup(aya):
    with pytest.raises(ValueError, match=r"limit_mm_per_prompt.audio: .* takes image only"):
        LLM(aya, **ENGINE, limit_mm_per_prompt={"audio": 1})


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (
            lambda d: make_tiny_qwen2_vl(d),
            "Qwen2VLForConditionalGeneration places image tokens with M-RoPE",
        ),
        (
            lambda d: make_tiny_gemma3(d),
            "Gemma3ForConditionalGeneration attends bidirectionally within images",
        ),
    ],
)
def test_what_the_fallback_cannot_run_is_refused_naming_the_architecture(tmp_path, make, reason):
    path = str(make(tmp_path))
    with pytest.raises(ValueError, match=reason):
        LLM(path, **ENGINE, model_impl="transformers", load_format="dummy")


def test_tensor_parallelism_is_refused_for_the_image_fallback(aya):
    with pytest.raises(
        ValueError,
        match="AyaVisionForConditionalGeneration runs through the "
        "transformers fallback for image-text-to-text models, which runs on one rank",
    ):
        LLM(aya, **ENGINE, tensor_parallel_size=2, load_format="dummy")
