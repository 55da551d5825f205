"""Qwen2-VL and Qwen2.5-VL end to end on the CPU: greedy tokens and logprobs equal
transformers' for one image, two of different sizes (so different grids and token counts),
images between text, an image alone and text-only prompts in one batch; under chunked prefill
(chunks ending inside images: each chunk takes its M-RoPE positions from the whole prompt's
layout) and preemption; the same image finds its prefix-cache blocks and a changed pixel does
not; a cache hit ending inside an image resumes there."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing_vision import (
    QWEN_IMAGE,
    assert_equals_transformers,
    hf_llava_greedy,
    hf_processor,
    make_tiny_qwen2_vl,
    random_image,
    record_chunk_ends,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=192, num_gpu_blocks_override=96, block_size=8)
IMG = QWEN_IMAGE
WIDE, SMALL, TALL = (70, 50), (40, 36), (30, 90)  # 12, 4 and 12 tokens: grids 3x4, 2x2, 6x2

# (prompt, [(image seed, size)]): one image, two of different sizes, text between images (one
# repeated), text only, an image alone (the prompt ends inside the image's positions)
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


@pytest.fixture(scope="module", params=["2", "2.5"], ids=["qwen2_vl", "qwen2_5_vl"])
def qwen(request, tmp_path_factory):
    return str(make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen"), version=request.param))


def _images(seeds: list[tuple[int, tuple[int, int]]]) -> list:
    return [random_image(seed, size) for seed, size in seeds]


@pytest.fixture(scope="module")
def expected(qwen):
    return [hf_llava_greedy(qwen, text, _images(seeds), MAX_TOKENS) for text, seeds in CASES]


def _prompt(text: str, seeds: list) -> dict | str:
    return {"prompt": text, "multi_modal_data": {"image": _images(seeds)}} if seeds else text


def test_the_cases_have_the_grids_they_say(qwen):
    # what the cases rely on: the images' token counts differ, so do their grids' shapes
    tokens = []
    for size in (WIDE, SMALL, TALL):
        prompt = hf_processor(qwen)(text=IMG, images=[random_image(0, size)])
        tokens.append(int(prompt["image_grid_thw"][0].prod()) // 4)
    assert tokens == [12, 4, 12]


@pytest.mark.parametrize("budget", [None, 8, 5])
def test_images_equal_transformers_batched_with_text(qwen, expected, budget):
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(qwen, **ENGINE, **chunking, enable_chunked_prefill=True)
    ends = record_chunk_ends(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    inside = [end for features, end in ends for f in features if f.offset < end < f.end]
    assert bool(inside) == (budget is not None), "chunks of 8 and 5 tokens cut the images"


def test_images_survive_preemption(qwen, expected):
    preemptions = []

    class Counter:
        def record(self, scheduler_stats, iteration_stats):
            preemptions.append(scheduler_stats.num_preemptions)

    llm = LLM(qwen, **{**ENGINE, "max_model_len": 72, "num_gpu_blocks_override": 9})
    llm.llm_engine.engine_core.stat_loggers.append(Counter())
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert sum(preemptions) > 0
    assert_equals_transformers(outputs, expected)


def test_same_image_hits_the_prefix_cache_changed_pixel_misses(qwen):
    llm = LLM(qwen, **ENGINE)
    text = f"The quick brown fox jumps over the lazy dog. {IMG} What is it?"
    image = random_image(7, WIDE)
    changed = image.copy()
    changed.putpixel((20, 18), tuple(255 - v for v in image.getpixel((20, 18))))
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [other] = llm.generate({"prompt": text, "multi_modal_data": {"image": changed}}, GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8
    pad = llm.get_tokenizer().convert_tokens_to_ids("<|image_pad|>")
    offset = first.prompt_token_ids.index(pad)
    assert 0 < other.num_cached_tokens == offset // 8 * 8 < again.num_cached_tokens
    assert_equals_transformers([other], [hf_llava_greedy(qwen, text, [changed], MAX_TOKENS)])
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_prefix_cache_hit_ending_inside_an_image_equals_transformers(qwen):
    # The second prompt shares the first's text and image and differs after it: its cached
    # blocks end inside the image, so its first chunk starts there, mid-layout.
    llm = LLM(qwen, **ENGINE, max_num_batched_tokens=8, enable_chunked_prefill=True)
    processor = hf_processor(qwen)
    pad = processor.image_token_ids[0]
    image = random_image(11, WIDE)
    for head in ("Look", "Look at", "Look at it", "A look at it", "A good look at it", "Hello"):
        first, second = f"{head} {IMG} yes", f"{head} {IMG} no, something else"
        ids = processor(text=first, images=[image])["input_ids"][0].tolist()
        other = processor(text=second, images=[image])["input_ids"][0].tolist()
        common = next(i for i, (a, b) in enumerate(zip(ids, other, strict=False)) if a != b)
        offset, cached = ids.index(pad), common // 8 * 8
        if offset < cached < offset + ids.count(pad):
            break
    else:
        pytest.fail("no prompt puts the cached blocks' end inside the image")
    llm.generate({"prompt": first, "multi_modal_data": {"image": image}}, GREEDY)
    [output] = llm.generate({"prompt": second, "multi_modal_data": {"image": image}}, GREEDY)
    assert output.num_cached_tokens == cached
    assert_equals_transformers([output], [hf_llava_greedy(qwen, second, [image], MAX_TOKENS)])


def test_a_prompt_without_its_image_placeholder_is_refused(qwen):
    llm = LLM(qwen, **ENGINE)
    image = random_image(1, SMALL)
    with pytest.raises(ValueError, match="placeholder"):
        llm.generate({"prompt": "no image here", "multi_modal_data": {"image": image}}, GREEDY)


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_images_across_ranks(qwen, expected, tp, pp):
    # The first stage encodes the images (the tower replicated on its tensor ranks); every
    # stage lays out the M-RoPE positions.
    llm = LLM(
        qwen,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
