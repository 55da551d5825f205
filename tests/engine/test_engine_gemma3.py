"""Gemma 3 with images end to end on the CPU: greedy tokens and logprobs equal transformers'
(whose image tokens attend to their whole image, later ones too) for one image, two, images
between text and text-only prompts in one batch; under chunked prefill (no chunk ends inside
an image) and preemption; pan-and-scan crops through ``mm_processor_kwargs``; the same image
finds its prefix-cache blocks and a changed pixel does not."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing_vision import (
    GEMMA3_BOI,
    GEMMA3_SLIDING_WINDOW,
    GEMMA3_TOKENS_PER_IMAGE,
    assert_equals_transformers,
    hf_llava_greedy,
    hf_processor,
    make_tiny_gemma3,
    random_image,
    record_chunk_ends,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=160, num_gpu_blocks_override=96, block_size=8)
IMG = GEMMA3_BOI

# (prompt, image seeds): one image, two, text between images, text only
CASES = [
    (f"Describe {IMG} please.", [1]),
    (f"Compare {IMG} with {IMG}", [2, 3]),
    (f"The quick brown fox {IMG} jumps over {IMG} the lazy dog {IMG} and", [4, 5, 4]),
    ("Hello world, what is the capital of France?", []),
    (IMG, [6]),
]
# pan-and-scan crops a wide image into crops of at least 8 pixels
PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return str(make_tiny_gemma3(tmp_path_factory.mktemp("gemma3")))


@pytest.fixture(scope="module")
def expected(gemma3):
    return [
        hf_llava_greedy(gemma3, text, [random_image(s) for s in seeds], MAX_TOKENS)
        for text, seeds in CASES
    ]


def _prompt(text: str, seeds: list[int], size: tuple[int, int] = (40, 36)) -> dict | str:
    if not seeds:
        return text
    images = [random_image(s, size) for s in seeds]
    return {"prompt": text, "multi_modal_data": {"image": images}}


def test_the_test_model_attends_within_images_through_a_window():
    # what the cases below rely on: an image is longer than the sliding window, so a sliding
    # layer's image token sees later tokens of its image but not every earlier one
    assert GEMMA3_TOKENS_PER_IMAGE > GEMMA3_SLIDING_WINDOW


@pytest.mark.parametrize("budget", [None, 8, 5])
def test_images_equal_transformers_batched_with_text(gemma3, expected, budget):
    # Budgets of 8 and 5 tokens a step would cut images across chunks; the scheduler moves
    # each chunk's end out of them.
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(gemma3, **ENGINE, **chunking, enable_chunked_prefill=True)
    ends = record_chunk_ends(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    assert not [end for features, end in ends for f in features if f.offset < end < f.end], (
        "a chunk ended inside an image"
    )


def test_images_survive_preemption(gemma3, expected):
    preemptions = []

    class Counter:
        def record(self, scheduler_stats, iteration_stats):
            preemptions.append(scheduler_stats.num_preemptions)

    llm = LLM(gemma3, **{**ENGINE, "max_model_len": 96, "num_gpu_blocks_override": 12})
    llm.llm_engine.engine_core.stat_loggers.append(Counter())
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert sum(preemptions) > 0
    assert_equals_transformers(outputs, expected)


def test_pan_and_scan_crops_through_mm_processor_kwargs(gemma3):
    # a wide image: the original and its crops, each an image of 4 tokens to the model
    text = f"Look at {IMG} and at {IMG} now"
    size = (96, 30)
    images = [random_image(8, size), random_image(9, (40, 36))]
    prompt_ids, tokens, logprobs = hf_llava_greedy(gemma3, text, images, MAX_TOKENS, **PAN_AND_SCAN)
    llm = LLM(gemma3, **ENGINE, mm_processor_kwargs=PAN_AND_SCAN, max_num_batched_tokens=8)
    [output] = llm.generate({"prompt": text, "multi_modal_data": {"image": images}}, GREEDY)
    assert_equals_transformers([output], [(prompt_ids, tokens, logprobs)])
    soft = llm.get_tokenizer().convert_tokens_to_ids("<image_soft_token>")
    assert prompt_ids.count(soft) > 2 * GEMMA3_TOKENS_PER_IMAGE  # crops were made


def test_same_image_hits_the_prefix_cache_changed_pixel_misses(gemma3):
    llm = LLM(gemma3, **ENGINE)
    text = f"The quick brown fox jumps over the lazy dog. {IMG} What is it?"
    image = random_image(7)
    changed = image.copy()
    changed.putpixel((20, 18), tuple(255 - v for v in image.getpixel((20, 18))))
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [other] = llm.generate({"prompt": text, "multi_modal_data": {"image": changed}}, GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8
    soft = llm.get_tokenizer().convert_tokens_to_ids("<image_soft_token>")
    offset = first.prompt_token_ids.index(soft)
    assert 0 < other.num_cached_tokens == offset // 8 * 8 < again.num_cached_tokens
    _, tokens, _ = hf_llava_greedy(gemma3, text, [changed], MAX_TOKENS)
    assert other.outputs[0].token_ids == tokens
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_budget_smaller_than_an_image_is_refused(gemma3):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(gemma3, **ENGINE, max_num_batched_tokens=GEMMA3_TOKENS_PER_IMAGE - 1)


def _expanded(path: str, text: str, image) -> list[int]:
    return hf_processor(path)(text=text, images=[image])["input_ids"][0]


def test_a_prefix_cache_hit_ending_inside_an_image_equals_transformers(gemma3):
    # The second prompt shares the first's text and image and differs after it: its cached
    # blocks end inside the image, and its first chunk starts there and runs to the image's end.
    llm = LLM(gemma3, **ENGINE, max_num_batched_tokens=8, enable_chunked_prefill=True)
    soft = llm.get_tokenizer().convert_tokens_to_ids("<image_soft_token>")
    image = random_image(11)
    for head in ("Look", "Look at", "Look at it", "A look at it", "A good look at it", "Hello"):
        first, second = f"{head} {IMG} yes", f"{head} {IMG} no, something else"
        ids, other = _expanded(gemma3, first, image), _expanded(gemma3, second, image)
        common = next(i for i, (a, b) in enumerate(zip(ids, other, strict=False)) if a != b)
        offset, cached = ids.index(soft), common // 8 * 8
        if offset < cached < offset + GEMMA3_TOKENS_PER_IMAGE:
            break
    else:
        pytest.fail("no prompt puts the cached blocks' end inside the image")
    llm.generate({"prompt": first, "multi_modal_data": {"image": image}}, GREEDY)
    [output] = llm.generate({"prompt": second, "multi_modal_data": {"image": image}}, GREEDY)
    assert output.num_cached_tokens == cached
    assert_equals_transformers([output], [hf_llava_greedy(gemma3, second, [image], MAX_TOKENS)])


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_images_across_ranks(gemma3, expected, tp, pp):
    # The first stage encodes the images (the tower replicated on its tensor ranks); every
    # stage's attention layers take the images' spans.
    llm = LLM(
        gemma3,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
