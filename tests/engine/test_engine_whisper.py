"""Whisper end to end on the CPU: greedy tokens and logprobs equal transformers' for generated
waveforms batched together, with a previous-text prompt cut across chunked-prefill steps and
under preemption; each request's audio encoded once; the same audio hits the prefix cache and
another misses; bad audio is refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.testing_audio import hf_whisper_greedy, make_tiny_whisper, tone
from infernetes.runtime.testing_vision import assert_equals_transformers

from infernetes import LLM, SamplingParams

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ENGINE = dict(dtype="float32", num_gpu_blocks_override=64, block_size=8)
TRANSCRIBE = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
# (decoder prompt, waveform seed, seconds)
CASES = [
    (TRANSCRIBE, 1, 2.0),
    ("<|startoftranscript|><|fr|><|translate|><|notimestamps|>", 2, 5.5),
    ("<|startofprev|>the quick brown fox" + TRANSCRIBE, 3, 1.0),
]


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    return str(make_tiny_whisper(tmp_path_factory.mktemp("whisper")))


@pytest.fixture(scope="module")
def expected(whisper):
    return [
        hf_whisper_greedy(whisper, tone(seed, seconds), prompt, MAX_TOKENS)
        for prompt, seed, seconds in CASES
    ]


def _prompt(prompt: str, seed: int, seconds: float, rate: int = 16000) -> dict:
    samples = tone(seed, seconds, rate)
    return {"prompt": prompt, "multi_modal_data": {"audio": (samples, rate)}}


def _count_encoded(llm: LLM) -> list[int]:
    """How many clips each call of the model's encoder takes."""
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    counts: list[int] = []
    encode = model.encode

    def counted(features):
        counts.append(len(features))
        return encode(features)

    model.encode = counted
    return counts


@pytest.mark.parametrize("budget", [None, 4])
def test_transcriptions_equal_transformers_batched(whisper, expected, budget):
    # A budget of 4 tokens a step cuts the previous-text prompt across steps.
    chunking = {} if budget is None else dict(max_num_batched_tokens=4, enable_chunked_prefill=True)
    llm = LLM(whisper, **ENGINE, **chunking)
    encoded = _count_encoded(llm)
    outputs = llm.generate([_prompt(*case) for case in CASES], GREEDY)
    assert_equals_transformers(outputs, expected)
    assert sum(encoded) == len(CASES)  # each clip once, however its prompt is cut
    # the audio matters: the same prompt over other audio decodes otherwise
    assert outputs[0].outputs[0].token_ids != outputs[2].outputs[0].token_ids


def test_transcriptions_survive_preemption(whisper, expected):
    preemptions = []

    class Counter:
        def record(self, scheduler_stats, iteration_stats):
            preemptions.append(scheduler_stats.num_preemptions)

    llm = LLM(whisper, **{**ENGINE, "num_gpu_blocks_override": 6, "max_model_len": 40})
    llm.llm_engine.engine_core.stat_loggers.append(Counter())
    outputs = llm.generate([_prompt(*case) for case in CASES], GREEDY)
    assert sum(preemptions) > 0
    assert_equals_transformers(outputs, expected)


def test_resampled_audio_and_the_decoder_prompt(whisper):
    llm = LLM(whisper, **ENGINE)
    processor = llm.llm_engine.input_processor.mm_processor
    assert processor.decoder_prompt("translate", "fr", "") == CASES[1][0]
    assert processor.decoder_prompt("transcribe", "en", "the quick brown fox") == CASES[2][0]
    # 8 kHz audio is resampled to the model's 16 kHz: the same as giving it at 16 kHz
    slow = tone(4, 2.0, 8000)
    from scipy.signal import resample_poly

    at_16k = resample_poly(slow, 2, 1).astype(np.float32)
    [given] = llm.generate(
        {"prompt": TRANSCRIBE, "multi_modal_data": {"audio": (slow, 8000)}}, GREEDY
    )
    _, tokens, _ = hf_whisper_greedy(whisper, at_16k, TRANSCRIBE, MAX_TOKENS)
    assert given.outputs[0].token_ids == tokens


def test_same_audio_hits_the_prefix_cache_other_audio_misses(whisper):
    llm = LLM(whisper, **ENGINE)
    prompt = "<|startofprev|>the quick brown fox jumps" + TRANSCRIBE
    [first] = llm.generate(_prompt(prompt, 5, 1.0), GREEDY)
    [again] = llm.generate(_prompt(prompt, 5, 1.0), GREEDY)
    [other] = llm.generate(_prompt(prompt, 6, 1.0), GREEDY)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(first.prompt_token_ids) // 8 * 8 > 0
    assert other.num_cached_tokens == 0  # the decoder's keys depend on the audio
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


@pytest.mark.parametrize(
    ("prompt", "field", "message"),
    [
        (TRANSCRIBE, "multi_modal_data.audio", "transcribes audio: a prompt needs"),
        (
            {"prompt": TRANSCRIBE, "multi_modal_data": {"audio": (tone(1, 31.0), 16000)}},
            "multi_modal_data.audio",
            "31.0 s of audio; one prompt takes at most 30 s",
        ),
        (
            {"prompt": TRANSCRIBE, "multi_modal_data": {"audio": [tone(1), tone(2)]}},
            "multi_modal_data.audio",
            "one audio clip per prompt, got 2",
        ),
        (
            {"prompt": TRANSCRIBE, "multi_modal_data": {"audio": (np.zeros(0), 16000)}},
            "multi_modal_data.audio",
            "a non-empty 1-D array",
        ),
        (
            {"prompt": TRANSCRIBE, "multi_modal_data": {"audio": (tone(1), 0)}},
            "multi_modal_data.audio",
            "sample rate must be a positive integer",
        ),
        (
            {"prompt": TRANSCRIBE, "multi_modal_data": {"image": tone(1)}},
            "multi_modal_data.image",
            "image: this model takes audio only",
        ),
    ],
)
def test_bad_audio_is_refused_naming_the_field(whisper, prompt, field, message):
    llm = LLM(whisper, **ENGINE)
    with pytest.raises(RequestError, match=message) as error:
        llm.generate(prompt, GREEDY)
    assert error.value.param == field
    # the engine goes on serving
    [output] = llm.generate(_prompt(*CASES[0]), GREEDY)
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(tensor_parallel_size=2), "runs on one rank"),
        (dict(pipeline_parallel_size=2), "runs on one rank"),
        (dict(skip_tokenizer_init=True), "skip_tokenizer_init is not supported"),
        (dict(enable_lora=True), "enable_lora is not supported for Whisper"),
        (
            dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
            "speculative_config is not supported for Whisper",
        ),
        (dict(task="embed"), "task='embed' does not fit Whisper"),
        (dict(limit_mm_per_prompt={"image": 1}), "takes audio only"),
    ],
)
def test_what_whisper_is_not_served_with_is_refused(whisper, settings, message):
    with pytest.raises(ValueError, match=message):
        LLM(whisper, **ENGINE, **settings)


def test_task_transcription_is_for_speech_models(whisper, tmp_path):
    from infernetes.runtime.testing import make_tiny_llama

    for task in ("transcription", "generate"):
        LLM(whisper, **ENGINE, task=task)
    with pytest.raises(ValueError, match="transcription is for speech models"):
        LLM(str(make_tiny_llama(tmp_path)), dtype="float32", task="transcription")


def test_the_kv_memory_keeps_room_for_each_running_requests_cross_attention(whisper):
    # tiny: 2 layers x 1500 frames x 64 wide, keys and values, float32: 1.5 MiB a request
    per_request = 2 * 2 * 1500 * 64 * 4
    memory = 64 * per_request
    blocks = {
        seqs: LLM(
            whisper, dtype="float32", block_size=8, kv_cache_memory_bytes=memory, max_num_seqs=seqs
        ).llm_engine.engine_core.num_blocks
        for seqs in (4, 8)
    }
    runner = LLM(whisper, **ENGINE).llm_engine.engine_core.executor.driver_worker.model_runner
    assert runner.cross_attention_bytes_per_request() == per_request
    assert blocks[4] - blocks[8] == 4 * per_request // runner.bytes_per_block
    with pytest.raises(ValueError, match="lower --max-num-seqs"):
        LLM(whisper, dtype="float32", kv_cache_memory_bytes=memory, max_num_seqs=64)


def test_a_context_past_the_decoders_positions_is_refused(whisper, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with pytest.raises(ValueError, match="it has 64 learned positions"):
        LLM(whisper, **ENGINE, max_model_len=100)
