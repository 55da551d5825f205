"""LLaVA-OneVision on the CPU, through its stand-in processor (transformers' needs torchvision):
each image's placeholder count equals what transformers' processor's own arithmetic gives for
it; the model's image features equal transformers' row for row for sizes that pick every tiling
here; greedy tokens and logprobs equal transformers' (fed the stand-in's arrays) for one image,
two images (each then squared and untiled), a video, and a text prompt batched with them, whole
and cut across prefill chunks; an image among several is keyed apart from the same one alone."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from infernetes.runtime.model_executor.loader import build_model, inspect_model, load_hf_config
from infernetes.runtime.testing_vision import (
    assert_equals_transformers,
    hf_llava_greedy,
    hf_processor,
    make_tiny_llava_onevision,
    random_image,
)

from infernetes import LLM, SamplingParams

# (width, height): 2 to 4 grid tiles; the 4-tile grids are over 2 tiles' worth: scaled down
SIZES = [(40, 36), (100, 30), (30, 70), (64, 64), (90, 40)]
MAX_TOKENS = 5
ENGINE = dict(dtype="float32", max_model_len=400, num_gpu_blocks_override=64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    return str(make_tiny_llava_onevision(tmp_path_factory.mktemp("onevision")))


def test_placeholder_counts_follow_transformers_arithmetic(onevision):
    from transformers import AutoConfig, LlavaOnevisionProcessor

    processor = hf_processor(onevision)
    config = AutoConfig.from_pretrained(onevision)
    side = config.vision_config.image_size
    # transformers' processor cannot be built here; its counting methods run on what they read
    reference = types.SimpleNamespace(
        image_processor=processor.image_processor,
        num_image_tokens=(side // config.vision_config.patch_size) ** 2,
        vision_aspect_ratio=config.vision_aspect_ratio,
    )
    reference._get_unpadded_features = types.MethodType(
        LlavaOnevisionProcessor._get_unpadded_features, reference
    )
    counts = []
    for seed, (width, height) in enumerate(SIZES):
        expected = LlavaOnevisionProcessor._get_number_of_features(
            reference, height, width, side, side
        )
        out = processor(text="a <image> b", images=[random_image(seed, (width, height))])
        assert (out["input_ids"] == config.image_token_index).sum() == expected
        counts.append(expected)
    assert len(set(counts)) > 2
    two = processor(text="<image><image>", images=[random_image(0), random_image(1, (90, 40))])
    assert (two["input_ids"] == config.image_token_index).sum() == 2 * (
        reference.num_image_tokens + 1
    )
    assert two["pixel_values"].shape[:2] == (2, 1)  # squared, untiled


def test_image_features_equal_transformers(onevision):
    from transformers import AutoImageProcessor, LlavaOnevisionForConditionalGeneration

    images = [random_image(seed, size) for seed, size in enumerate(SIZES)]
    inputs = AutoImageProcessor.from_pretrained(onevision)(images, return_tensors="pt")
    hf = LlavaOnevisionForConditionalGeneration.from_pretrained(onevision).eval()
    path = Path(onevision)
    info = inspect_model(path, load_hf_config(path), "float32", 64, torch.device("cpu"))
    model = build_model(info, torch.device("cpu"), use_tqdm=False)
    fit, scaled = model.fit, []
    model.fit = lambda grid: scaled.append(fit(grid).shape != grid.shape) or fit(grid)
    with torch.inference_mode():
        expected = hf.model.get_image_features(
            pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"]
        ).pooler_output
        ours = model.embed_multimodal(
            "image",
            {"pixel_values": inputs["pixel_values"], "image_sizes": inputs["image_sizes"]},
        )
    assert [len(rows) for rows in ours] == [len(rows) for rows in expected]
    assert len(scaled) == len(SIZES) and any(scaled) and not all(scaled)
    for rows, reference in zip(ours, expected, strict=True):
        torch.testing.assert_close(rows, reference, atol=1e-5, rtol=1e-5)


def _frames(seed: int, count: int) -> list:
    return [random_image(seed + i, (48, 40)) for i in range(count)]


CASES = [
    ("USER: <image> what is it? ASSISTANT:", [random_image(3, (100, 30))], None),
    ("USER: <image> and <image> differ how? ASSISTANT:", [random_image(4), random_image(5)], None),
    ("USER: <video> what happens? ASSISTANT:", [], [_frames(6, 3)]),
    ("USER: no picture at all ASSISTANT:", [], None),
]


@pytest.fixture(scope="module")
def expected(onevision):
    return [
        hf_llava_greedy(onevision, prompt, images, MAX_TOKENS, videos=videos)
        for prompt, images, videos in CASES
    ]


def _prompt(text: str, images: list, videos: list | None) -> dict | str:
    data: dict = {}
    if images:
        data["image"] = images if len(images) > 1 else images[0]
    if videos:
        data["video"] = videos[0]
    return {"prompt": text, "multi_modal_data": data} if data else text


@pytest.mark.parametrize("budget", [None, 16])
def test_greedy_equals_transformers_batched(onevision, expected, budget):
    # a budget of 16 tokens a step cuts every image and the video across prefill chunks
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(onevision, **ENGINE, **chunking)
    outputs = llm.generate([_prompt(*case) for case in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    video = llm.llm_engine.tokenizer.convert_tokens_to_ids("<video>")
    # 3 frames of 4 x 4 patches pooled to 2 x 2, and a newline
    assert outputs[2].prompt_token_ids.count(video) == 3 * 2 * 2 + 1


def test_an_image_among_several_is_keyed_apart(onevision):
    # alone it is tiled, among others squared: other features, so another prefix-cache key
    llm = LLM(onevision, **ENGINE)
    processor = llm.llm_engine.input_processor.mm_processor
    image = random_image(7, (90, 40))
    [alone] = processor.process("<image>", {"image": image}).features
    first, _ = processor.process("<image><image>", {"image": [image, image]}).features
    assert alone.identifier != first.identifier
    assert alone.length > first.length
