"""LLaVA end to end on the CPU: greedy tokens and logprobs equal transformers' for one image,
two, images between text and text-only prompts in the same batch; under chunked prefill (an
image's placeholders cut across steps) and preemption; the same image finds its prefix-cache
blocks and a changed pixel does not; bad multimodal input is refused naming the field."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing import StepTotals
from infernetes.runtime.testing_vision import (
    assert_equals_transformers,
    hf_llava_greedy,
    make_tiny_llava,
    random_image,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=160, num_gpu_blocks_override=96, block_size=8)

# (prompt, image seeds): one image, two, text between images, text only
CASES = [
    ("Describe <image> please.", [1]),
    ("Compare <image> with <image>", [2, 3]),
    ("The quick brown fox <image> jumps over <image> the lazy dog <image> and", [4, 5, 4]),
    ("Hello world, what is the capital of France?", []),
    ("<image>", [6]),
]


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return str(make_tiny_llava(tmp_path_factory.mktemp("llava")))


@pytest.fixture(scope="module")
def expected(llava):
    return [
        hf_llava_greedy(llava, text, [random_image(s) for s in seeds], MAX_TOKENS)
        for text, seeds in CASES
    ]


def _prompt(text: str, seeds: list[int]) -> dict | str:
    if not seeds:
        return text
    return {"prompt": text, "multi_modal_data": {"image": [random_image(s) for s in seeds]}}


@pytest.mark.parametrize("budget", [None, 8])
def test_images_equal_transformers_batched_with_text(llava, expected, budget):
    # A budget of 8 tokens a step cuts each image's 16 placeholder rows across chunks.
    chunking = {} if budget is None else dict(max_num_batched_tokens=8, enable_chunked_prefill=True)
    llm = LLM(llava, **ENGINE, **chunking)
    encoded = _count_encoded(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    # each image of a prompt once, however cut (one it repeats, once)
    assert sum(encoded) == sum(len(set(seeds)) for _, seeds in CASES)


def _count_encoded(llm: LLM) -> list[int]:
    """How many images each call of the model's encoder takes."""
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    counts: list[int] = []
    encode = model.embed_multimodal

    def counted(modality, data):
        counts.append(len(data["pixel_values"]))
        return encode(modality, data)

    model.embed_multimodal = counted
    return counts


def test_images_survive_preemption(llava, expected):
    # 12 blocks of 8 for prompts of up to 68 tokens: requests are preempted and recompute
    # their prompts, images encoded again.
    llm = LLM(llava, **{**ENGINE, "max_model_len": 96, "num_gpu_blocks_override": 12})
    totals = StepTotals.attach(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert totals.preemptions > 0
    assert_equals_transformers(outputs, expected)


def test_same_image_hits_the_prefix_cache_changed_pixel_misses(llava):
    llm = LLM(llava, **ENGINE)
    text = "The quick brown fox jumps over the lazy dog. <image> What is it?"
    image = random_image(7)
    changed = image.copy()
    changed.putpixel((20, 18), tuple(255 - v for v in image.getpixel((20, 18))))
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    [other] = llm.generate({"prompt": text, "multi_modal_data": {"image": changed}}, GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8
    # only the blocks wholly before the image are shared
    offset = next(i for i, t in enumerate(first.prompt_token_ids) if t == _image_id(llm))
    assert 0 < other.num_cached_tokens == offset // 8 * 8 < again.num_cached_tokens
    _, tokens, _ = hf_llava_greedy(llava, text, [changed], MAX_TOKENS)
    assert other.outputs[0].token_ids == tokens
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def _image_id(llm: LLM) -> int:
    return llm.get_tokenizer().convert_tokens_to_ids("<image>")


def test_processor_kwargs_from_the_flag_and_the_request(llava):
    image = random_image(8)
    text = "Describe <image> please."
    _, plain, _ = hf_llava_greedy(llava, text, [image], MAX_TOKENS)
    _, raw, _ = hf_llava_greedy(llava, text, [image], MAX_TOKENS, do_normalize=False)
    assert plain != raw  # the setting changes what the model sees
    flagged = LLM(llava, **ENGINE, mm_processor_kwargs={"do_normalize": False})
    [output] = flagged.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    assert output.outputs[0].token_ids == raw
    [output] = flagged.generate(
        {
            "prompt": text,
            "multi_modal_data": {"image": image},
            "mm_processor_kwargs": {"do_normalize": True},
        },
        GREEDY,
    )
    assert output.outputs[0].token_ids == plain


def _image_prompt(text: str, images) -> dict:
    return {"prompt": text, "multi_modal_data": {"image": images}}


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (lambda: _image_prompt("a <image> b", []), "1 image placeholder"),
        (lambda: _image_prompt("no placeholder", random_image(1)), "0 image placeholder"),
        (lambda: _image_prompt("a <image>", "x"), r"image\[0\]: a PIL image, got str"),
        (lambda: {"prompt": "a", "multi_modal_data": {"audio": 1}}, "takes image only"),
        (lambda: {"prompt_token_ids": [1], "multi_modal_data": {}}, "needs a text 'prompt'"),
        (lambda: {"prompt": "a", "multi_modal_data": [1]}, "multi_modal_data must be a dict"),
        (
            lambda: _image_prompt("a <image>", random_image(1, (4000, 10))),
            r"image\[0\]: 4000 x 10 pixels; the longer side may be at most 200 times",
        ),
        (  # a processor setting that changes the image size would fail the step: refused first
            lambda: {
                **_image_prompt("a <image>", random_image(1)),
                "mm_processor_kwargs": {"size": {"shortest_edge": 64}, "crop_size": 64},
            },
            r"images of shape \[3, 64, 64\]; this model's vision tower takes \[3, 32, 32\]",
        ),
        (
            lambda: _image_prompt("<image><image>", [random_image(1), random_image(2)]),
            r"At most 1 image\(s\) may be provided in one prompt",
        ),
    ],
)
def test_bad_multimodal_input_is_refused(llava, prompt, message):
    llm = _limited(llava)
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt(), GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
    [output] = llm.generate(_prompt("Describe <image> please.", [1]), GREEDY)  # still serving
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


_LIMITED: dict[str, LLM] = {}


def _limited(path: str) -> LLM:
    if path not in _LIMITED:
        _LIMITED[path] = LLM(path, **ENGINE, limit_mm_per_prompt={"image": 1})
    return _LIMITED[path]


def test_a_text_model_refuses_images(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=8)
    image = {"prompt": "a <image>", "multi_modal_data": {"image": random_image(1)}}
    with pytest.raises(ValueError, match="LlamaForCausalLM takes text only: it cannot take image"):
        llm.generate(image, GREEDY)


def test_limits_for_modalities_the_model_lacks_are_refused_at_startup(llava):
    with pytest.raises(ValueError, match=r"limit_mm_per_prompt.audio: .* takes image only"):
        LLM(llava, **ENGINE, limit_mm_per_prompt={"audio": 1})
    with pytest.raises(ValueError, match="limit_mm_per_prompt: unknown modality 'smell'"):
        LLM(llava, **ENGINE, limit_mm_per_prompt={"smell": 1})


def _data_url(image, kind: str = "PNG") -> str:
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, kind)
    return f"data:image/{kind.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def test_chat_with_image_parts_as_vllm_spells_them(llava):
    llm = LLM(llava, **ENGINE)
    first, second = random_image(9), random_image(10)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look at"},
                {"type": "image_url", "image_url": {"url": _data_url(first)}},
                {"type": "text", "text": "and at"},
                {"type": "image_pil", "image_pil": second},
            ],
        }
    ]
    [output] = llm.chat(messages, GREEDY)
    # the template puts each image's placeholder where its part stood
    text = "<|im_start|>user\nLook at<image>and at<image><|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, tokens, logprobs = hf_llava_greedy(
        llava, text, [first, second], MAX_TOKENS, add_special_tokens=False
    )
    assert_equals_transformers([output], [(prompt_ids, tokens, logprobs)])


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_images_across_ranks(llava, expected, tp, pp):
    # The images cross to every rank; the first stage encodes them (the tower replicated on its
    # tensor ranks), the language model is sharded or staged as Llama's.
    llm = LLM(
        llava,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
