"""The transformers fallback for image-text-to-text models: transformers' vision tower and
projector (``get_image_features``) and its language model on this engine's paged attention give
transformers' greedy tokens and logprobs for one image, two, and text batched with them, whole
and under chunked prefill, a wide image as its processor's tiles; the same image hits the prefix cache; what it cannot take is refused
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
WIDE = (96, 30)  # Aya Vision's processor cuts it into 3 tiles and a global one

# (prompt, images by seed and size): one image, three (one repeated, one wide), text only
CASES = [
    ("Describe <image> please.", [(1, None)]),
    ("Compare <image> with <image> and <image>", [(2, None), (3, WIDE), (2, None)]),
    ("Hello world, what is the capital of France?", []),
    ("<image>", [(4, WIDE)]),
]


def _images(seeds: list) -> list:
    return [random_image(seed, size) if size else random_image(seed) for seed, size in seeds]


def _prompt(text: str, seeds: list) -> dict | str:
    if not seeds:
        return text
    return {"prompt": text, "multi_modal_data": {"image": _images(seeds)}}


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
        hf_llava_greedy(path, text, _images(seeds), MAX_TOKENS, **processor_kwargs)
        for text, seeds in CASES
    ]


@pytest.mark.parametrize("crops", [True, False])
@pytest.mark.parametrize("budget", [None, 8])
def test_aya_vision_equals_transformers_batched_with_text(aya, budget, crops):
    # No native implementation: auto runs the fallback. A wide image is its processor's tiles,
    # one item, their marks between them (crop_to_patches, on by its default). A budget of 8
    # tokens a step cuts each image's 16 feature tokens a tile across chunks.
    chunking = {} if budget is None else dict(max_num_batched_tokens=8, enable_chunked_prefill=True)
    settings = {"crop_to_patches": crops}
    llm = LLM(aya, **ENGINE, **chunking, mm_processor_kwargs=settings)
    assert type(_model(llm)).__name__ == "TransformersForImageTextToText"
    encoded = _count_encoded(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, _expected(aya, **settings))
    # each image of a prompt once, however cut (one it repeats, once); a wide one's tiles
    tiles = 4 if crops else 1
    assert sorted(encoded) == sorted([1, 1, tiles, tiles])


def _count_encoded(llm: LLM) -> list[int]:
    """How many tiles each image given to the model's encoder has."""
    model = _model(llm)
    counts: list[int] = []
    encode = model.embed_multimodal

    def counted(modality, data):
        counts.extend(len(tiles) for tiles in data["pixel_values"])
        return encode(modality, data)

    model.embed_multimodal = counted
    return counts


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
    llm = LLM(aya, **ENGINE)
    text = "The quick brown fox jumps over the lazy dog. <image> What is it?"
    image, other = random_image(7, WIDE), random_image(8, WIDE)
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [changed] = llm.generate({"prompt": text, "multi_modal_data": {"image": other}}, GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == (len(first.prompt_token_ids) - 1) // 8 * 8  # all but the last
    assert changed.num_cached_tokens < again.num_cached_tokens  # only the blocks before it
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    _, tokens, _ = hf_llava_greedy(aya, text, [other], MAX_TOKENS)
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
    ],
)
def test_what_the_fallback_cannot_take_is_refused(aya, prompt, message):
    llm = _aya_llm(aya)
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt(), GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
    [output] = llm.generate(
        _prompt("Describe <image> please.", [(1, None)]), GREEDY
    )  # still serving
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


_AYA: dict[str, LLM] = {}


def _aya_llm(path: str) -> LLM:
    if path not in _AYA:
        _AYA[path] = LLM(path, **ENGINE)
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
