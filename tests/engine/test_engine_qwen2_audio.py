"""Qwen2-Audio end to end on the CPU: greedy tokens and logprobs equal transformers' for one
clip, two of different lengths (so different token counts), clips between text (one repeated)
and a text-only prompt in one batch; under chunked prefill (chunks ending inside clips) and
preemption; each clip encoded once; the same clip finds its prefix-cache blocks and a changed
sample does not; bad audio is refused naming the field; across tensor and pipeline ranks."""

from __future__ import annotations

import numpy as np
import pytest
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.audio import decode_audio
from infernetes.runtime.multimodal.audio_language import audio_token_count
from infernetes.runtime.testing import StepTotals
from infernetes.runtime.testing_audio import QWEN_AUDIO, make_tiny_qwen2_audio, tone
from infernetes.runtime.testing_vision import (
    assert_equals_transformers,
    hf_llava_greedy,
    record_chunk_ends,
)

from infernetes import LLM, SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=96, block_size=8)
A = QWEN_AUDIO
# (prompt, [(clip seed, seconds)]): one clip, two of different lengths, text between clips (one
# repeated), text only
CASES = [
    (f"What is {A}?", [(1, 1.0)]),
    (f"Compare {A} with {A}", [(2, 0.5), (3, 1.5)]),
    (
        f"The quick brown fox {A} jumps over {A} the lazy dog {A} and",
        [(4, 1.0), (5, 0.3), (4, 1.0)],
    ),
    ("Hello world, what is the capital of France?", []),
]


@pytest.fixture(scope="module")
def qwen_audio(tmp_path_factory):
    return str(make_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2_audio")))


def _clips(seeds: list[tuple[int, float]]) -> list[np.ndarray]:
    return [tone(seed, seconds) for seed, seconds in seeds]


@pytest.fixture(scope="module")
def expected(qwen_audio):
    return [
        hf_llava_greedy(qwen_audio, text, [], MAX_TOKENS, audio=_clips(seeds))
        for text, seeds in CASES
    ]


def _prompt(text: str, seeds: list) -> dict | str:
    clips = [(clip, 16000) for clip in _clips(seeds)]
    return {"prompt": text, "multi_modal_data": {"audio": clips}} if seeds else text


def _count_encoded(llm: LLM) -> list[int]:
    """How many clips each call of the model's encoder takes."""
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    counts: list[int] = []
    embed = model.embed_multimodal

    def counted(modality, data):
        counts.append(len(data["input_features"]))
        return embed(modality, data)

    model.embed_multimodal = counted
    return counts


def test_each_clip_has_the_tokens_its_length_makes(qwen_audio, expected):
    # 1 s: 100 mel frames -> 50 after the second convolution -> 25 after the pool
    assert [audio_token_count(n) for n in (100, 50, 150, 30, 3000)] == [25, 12, 37, 7, 750]
    token = _audio_token(qwen_audio)
    for (prompt_ids, _, _), (_, seeds) in zip(expected, CASES, strict=True):
        frames = [round(seconds * 100) for _, seconds in seeds]
        assert prompt_ids.count(token) == sum(audio_token_count(n) for n in frames)


def _audio_token(path: str) -> int:
    import transformers

    return transformers.AutoConfig.from_pretrained(path).audio_token_index


@pytest.mark.parametrize("budget", [None, 8])
def test_audio_equals_transformers_batched_with_text(qwen_audio, expected, budget):
    chunking = {} if budget is None else dict(max_num_batched_tokens=budget)
    llm = LLM(qwen_audio, **ENGINE, **chunking, enable_chunked_prefill=True)
    ends = record_chunk_ends(llm)
    encoded = _count_encoded(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    inside = [end for features, end in ends for f in features if f.offset < end < f.end]
    assert bool(inside) == (budget is not None), "chunks of 8 tokens cut the clips"
    assert sum(encoded) == 5  # each clip once, the repeated one once in its prompt
    # the audio matters: the same text over other audio goes on otherwise
    [other] = llm.generate(_prompt(CASES[0][0], [(9, 1.0)]), GREEDY)
    assert other.outputs[0].token_ids != outputs[0].outputs[0].token_ids


def test_audio_survives_preemption(qwen_audio, expected):
    llm = LLM(qwen_audio, **{**ENGINE, "max_model_len": 96, "num_gpu_blocks_override": 14})
    totals = StepTotals.attach(llm)
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert totals.preemptions > 0
    assert_equals_transformers(outputs, expected)


def test_same_clip_hits_the_prefix_cache_changed_sample_misses(qwen_audio):
    llm = LLM(qwen_audio, **ENGINE)
    text = f"The quick brown fox jumps over the lazy dog. {A} What is it?"
    clip = tone(7, 1.0)
    changed = clip.copy()
    changed[8000] = -changed[8000]
    [first] = llm.generate({"prompt": text, "multi_modal_data": {"audio": (clip, 16000)}}, GREEDY)
    [again] = llm.generate({"prompt": text, "multi_modal_data": {"audio": (clip, 16000)}}, GREEDY)
    [other] = llm.generate(
        {"prompt": text, "multi_modal_data": {"audio": (changed, 16000)}}, GREEDY
    )
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8
    offset = first.prompt_token_ids.index(_audio_token(qwen_audio))
    assert 0 < other.num_cached_tokens == offset // 8 * 8 < again.num_cached_tokens
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert_equals_transformers(
        [other], [hf_llava_greedy(qwen_audio, text, [], MAX_TOKENS, audio=[changed])]
    )


@pytest.mark.parametrize(
    ("audio", "prompt", "field", "message"),
    [
        ([tone(1)], f"{A} and {A}", "multi_modal_data.audio", "2 audio placeholder"),
        ((tone(1, 31.0), 16000), A, "multi_modal_data.audio[0]", "31.0 s of audio"),
        ((np.zeros(0), 16000), A, "multi_modal_data.audio[0]", "a non-empty 1-D array"),
        ((tone(1), 0), A, "multi_modal_data.audio[0]", "sample rate must be a positive"),
        ((np.full(8, np.nan), 16000), A, "multi_modal_data.audio[0]", "must be finite"),
        ((tone(1, 0.01), 16000), A, "multi_modal_data.audio[0]", "too short"),
        ([tone(1), tone(2), tone(3)], A * 3, "multi_modal_data.audio", "At most 2 audio clip"),
    ],
)
def test_bad_audio_is_refused_naming_the_field(qwen_audio, audio, prompt, field, message):
    llm = LLM(qwen_audio, **ENGINE, limit_mm_per_prompt={"audio": 2})
    with pytest.raises(RequestError, match=message) as error:
        llm.generate({"prompt": prompt, "multi_modal_data": {"audio": audio}}, GREEDY)
    assert error.value.param == field
    with pytest.raises(RequestError, match="takes audio only") as error:
        llm.generate({"prompt": "hi", "multi_modal_data": {"image": tone(1)}}, GREEDY)
    assert error.value.param == "multi_modal_data.image"
    # the engine goes on serving
    [output] = llm.generate(_prompt(*CASES[0]), GREEDY)
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


def test_offline_chat_with_an_input_audio_part(qwen_audio):
    import base64

    from infernetes.runtime.testing_audio import wav_bytes

    llm = LLM(qwen_audio, **ENGINE)
    data = wav_bytes(tone(8, 1.0))
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode()}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hear:"}, part]}]
    [chatted] = llm.chat(messages, GREEDY)
    text = f"<|im_start|>user\nHear:{A}<|im_end|>\n<|im_start|>assistant\n"
    samples, rate = decode_audio(data)
    [given] = llm.generate({"prompt": text, "multi_modal_data": {"audio": (samples, rate)}}, GREEDY)
    assert chatted.prompt_token_ids == given.prompt_token_ids
    assert chatted.outputs[0].token_ids == given.outputs[0].token_ids


def test_a_limit_for_images_is_refused_at_startup(qwen_audio):
    with pytest.raises(ValueError, match=r"limit_mm_per_prompt\.image: .* takes audio only"):
        LLM(qwen_audio, **ENGINE, limit_mm_per_prompt={"image": 1})


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_audio_across_ranks(qwen_audio, expected, tp, pp):
    # The first stage encodes the clips (the encoder replicated on its tensor ranks).
    llm = LLM(
        qwen_audio,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    outputs = llm.generate([_prompt(text, seeds) for text, seeds in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
