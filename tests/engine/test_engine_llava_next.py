"""LLaVA-NeXT end to end on the CPU: anyres tiling (a base tile and 2 to 4 grid tiles per image,
unpadded, an ``image_newline`` per grid row) gives as many rows as the processor's placeholders
for each image's size, and greedy tokens and logprobs equal transformers' for one image, images
of different sizes and aspect ratios (next to each other too) and text-only prompts in one
batch, whole and under chunked prefill."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing_vision import (
    assert_equals_transformers,
    hf_llava_greedy,
    make_tiny_llava_next,
    random_image,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=400, num_gpu_blocks_override=256, block_size=8)

# (prompt, images as (seed, (width, height))): sizes that pick different tilings
CASES = [
    ("Describe <image> please.", [(1, (40, 36))]),
    ("Compare <image> with <image>", [(2, (100, 30)), (3, (30, 70))]),
    ("Hello world, what is the capital of France?", []),
    ("<image><image> side by side", [(4, (64, 64)), (5, (90, 40))]),
    ("A wide one: <image>", [(6, (33, 20))]),
]


def _images(specs):
    return [random_image(seed, size) for seed, size in specs]


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    return str(make_tiny_llava_next(tmp_path_factory.mktemp("llava_next")))


@pytest.fixture(scope="module")
def expected(llava_next):
    return [hf_llava_greedy(llava_next, text, _images(specs), MAX_TOKENS) for text, specs in CASES]


def _prompt(text: str, specs) -> dict | str:
    if not specs:
        return text
    return {"prompt": text, "multi_modal_data": {"image": _images(specs)}}


@pytest.mark.parametrize("budget", [None, 16])
def test_anyres_images_equal_transformers_batched_with_text(llava_next, expected, budget):
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(llava_next, **ENGINE, **chunking)
    outputs = llm.generate([_prompt(text, specs) for text, specs in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)


def test_the_tiling_changes_what_the_model_sees(llava_next, expected):
    # the same pixels at another size: another tiling and another continuation
    _, tokens, _ = hf_llava_greedy(llava_next, CASES[0][0], [random_image(1, (36, 40))], MAX_TOKENS)
    llm = LLM(llava_next, **ENGINE)
    [output] = llm.generate(_prompt(CASES[0][0], [(1, (36, 40))]), GREEDY)
    assert output.outputs[0].token_ids == tokens
    assert len(output.prompt_token_ids) != len(expected[0][0]) or tokens != expected[0][1]


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_anyres_images_across_ranks(llava_next, expected, tp, pp):
    # the first stage tiles and encodes (its tower replicated on its tensor ranks)
    llm = LLM(
        llava_next,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=16,
    )
    outputs = llm.generate([_prompt(text, specs) for text, specs in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)


def test_a_clip_tower_with_the_full_strategy_is_refused(tmp_path):
    # with CLIP's CLS row a tile's 17 rows make no 4 x 4 grid
    import json

    path = make_tiny_llava_next(tmp_path / "full")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(
        json.dumps({**config, "vision_feature_select_strategy": "full"})
    )
    with pytest.raises(ValueError, match="clip_vision_model tiles take 'default', got 'full'"):
        LLM(str(path), **ENGINE)
