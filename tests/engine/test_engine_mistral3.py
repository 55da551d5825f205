"""Mistral 3 (the Pixtral tower) and Pixtral-12B's layout (LLaVA with that tower) end to end on
the CPU: greedy tokens and logprobs equal
transformers' for one image, two of different sizes (grids of their own shapes, encoded together
with block-diagonal attention), images between text, an image alone and text-only prompts in one
batch; under chunked prefill (chunks ending inside an image's grid, between its [IMG_BREAK]s) and
preemption; the same image finds its prefix-cache blocks and a changed pixel does not."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing_vision import (
    PIXTRAL_LONGEST_EDGE,
    PIXTRAL_MERGE,
    PIXTRAL_PATCH,
    assert_equals_transformers,
    hf_llava_greedy,
    hf_processor,
    make_tiny_mistral3,
    make_tiny_pixtral,
    random_image,
    record_chunk_ends,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=192, num_gpu_blocks_override=96, block_size=8)
IMG = "[IMG]"
UNIT = PIXTRAL_PATCH * PIXTRAL_MERGE  # pixels of a merged patch's side (Pixtral's patch)
# (width, height) -> grids of merged patches (rows x columns): 5 x 6, 5 x 5, 6 x 2
WIDE, SMALL, TALL = (70, 50), (40, 36), (30, 90)

CASES = [
    (f"Describe {IMG} please.", [(1, WIDE)]),
    (f"Compare {IMG} with {IMG}", [(2, SMALL), (3, TALL)]),
    (
        f"The quick brown fox {IMG} jumps over {IMG} the lazy dog {IMG} and",
        [(4, WIDE), (5, SMALL), (4, WIDE)],
    ),
    ("Hello world, what is the capital of France?", []),
    (IMG, [(6, TALL)]),
]


@pytest.fixture(scope="module", params=["mistral3", "pixtral"])
def mistral3(request, tmp_path_factory):
    """Mistral 3, and Pixtral-12B's layout (LLaVA with the Pixtral tower, one row a patch)."""
    make = make_tiny_mistral3 if request.param == "mistral3" else make_tiny_pixtral
    return str(make(tmp_path_factory.mktemp(request.param)))


def _images(seeds: list[tuple[int, tuple[int, int]]]) -> list:
    return [random_image(seed, size) for seed, size in seeds]


@pytest.fixture(scope="module")
def expected(mistral3):
    return [hf_llava_greedy(mistral3, text, _images(seeds), MAX_TOKENS) for text, seeds in CASES]


def _prompt(text: str, seeds: list) -> dict | str:
    return {"prompt": text, "multi_modal_data": {"image": _images(seeds)}} if seeds else text


def test_each_image_is_a_grid_of_its_merged_patches(mistral3):
    # transformers' PixtralProcessor's layout: a row of [IMG] per row of merged patches, each
    # row ended by [IMG_BREAK], the last by [IMG_END]; the image resized into the longest edge
    processor = hf_processor(mistral3)
    tokenizer = processor.tokenizer
    for size, grid in ((WIDE, (5, 6)), (SMALL, (5, 5)), (TALL, (6, 2))):
        out = processor(text=f"a{IMG}b", images=[random_image(0, size)])
        height, width = out["image_sizes"][0].tolist()
        assert (height // UNIT, width // UNIT) == grid
        assert max(height, width) <= PIXTRAL_LONGEST_EDGE
        tokens = tokenizer.convert_ids_to_tokens(out["input_ids"][0].tolist())
        rows, columns = grid
        layout = ([IMG] * columns + ["[IMG_BREAK]"]) * (rows - 1) + [IMG] * columns + ["[IMG_END]"]
        start = tokens.index(IMG)
        assert tokens[start : start + len(layout)] == layout
        assert tokens[start + len(layout) :] == ["b"]
        counted = processor._get_num_multimodal_tokens(image_sizes=[size[::-1]]).num_image_tokens
        assert counted == [len(layout)]


@pytest.mark.parametrize("budget", [None, 8, 5])
def test_images_equal_transformers_batched_with_text(mistral3, expected, budget):
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(mistral3, **ENGINE, **chunking, enable_chunked_prefill=True)
    ends = record_chunk_ends(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    inside = [end for features, end in ends for f in features if f.offset < end < f.end]
    assert bool(inside) == (budget is not None), "chunks of 8 and 5 tokens cut the images"


def test_images_survive_preemption(mistral3, expected):
    preemptions = []

    class Counter:
        def record(self, scheduler_stats, iteration_stats):
            preemptions.append(scheduler_stats.num_preemptions)

    llm = LLM(mistral3, **{**ENGINE, "max_model_len": 136, "num_gpu_blocks_override": 20})
    llm.llm_engine.engine_core.stat_loggers.append(Counter())
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert sum(preemptions) > 0
    assert_equals_transformers(outputs, expected)


def test_same_image_hits_the_prefix_cache_changed_pixel_misses(mistral3):
    llm = LLM(mistral3, **ENGINE)
    text = f"The quick brown fox jumps over the lazy dog. {IMG} What is it?"
    image = random_image(7, WIDE)
    changed = image.copy()
    changed.putpixel((20, 18), tuple(255 - v for v in image.getpixel((20, 18))))
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [other] = llm.generate({"prompt": text, "multi_modal_data": {"image": changed}}, GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8
    offset = first.prompt_token_ids.index(llm.get_tokenizer().convert_tokens_to_ids(IMG))
    assert 0 < other.num_cached_tokens == offset // 8 * 8 < again.num_cached_tokens
    assert_equals_transformers([other], [hf_llava_greedy(mistral3, text, [changed], MAX_TOKENS)])
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_prompt_without_its_image_placeholder_is_refused(mistral3):
    llm = LLM(mistral3, **ENGINE)
    image = random_image(1, SMALL)
    with pytest.raises(ValueError, match="placeholder"):
        llm.generate({"prompt": "no image here", "multi_modal_data": {"image": image}}, GREEDY)


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_images_across_ranks(mistral3, expected, tp, pp):
    # The first stage encodes the images (the tower replicated on its tensor ranks) and embeds
    # each grid's [IMG_BREAK] and [IMG_END] through the vocabulary-split embedding.
    llm = LLM(
        mistral3,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)


def test_an_earlier_tower_layer_equals_transformers(tmp_path):
    # vision_feature_layer -2: the tower is built up to the layer read, the rest not loaded
    path = str(make_tiny_mistral3(tmp_path / "second_to_last", feature_layer=-2))
    text, seeds = CASES[1]
    llm = LLM(path, **ENGINE)
    outputs = llm.generate([_prompt(text, seeds)], GREEDY)
    assert_equals_transformers(outputs, [hf_llava_greedy(path, text, _images(seeds), MAX_TOKENS)])


def test_several_tower_layers_are_refused():
    # transformers' projector norms one layer's width and fails on several too
    import transformers
    from infernetes.runtime.model_executor.models.mistral3 import (
        Mistral3ForConditionalGeneration,
    )

    config = transformers.Mistral3Config(vision_feature_layer=[-1, -2])
    with pytest.raises(ValueError, match=r"vision_feature_layer .* one layer"):
        Mistral3ForConditionalGeneration(config, 64)
