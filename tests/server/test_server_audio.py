"""/v1/audio/transcriptions and /v1/audio/translations of a server running a tiny Whisper, with
the openai client: WAV and FLAC files (resampled to 16 kHz) transcribed as transformers does,
json, text and streamed answers, audio over 30 s split into clips; hostile files (empty,
corrupt, not audio, over the size cap) each a 400 naming ``file``, the server serving on; a
text model refuses the route naming ``model``; /health answers while audio is processed."""

from __future__ import annotations

import concurrent.futures
import io
import threading

import httpx
import numpy as np
import openai
import pytest
from infernetes.runtime.testing_audio import (
    SAMPLE_RATE,
    hf_whisper_greedy,
    make_tiny_whisper,
    tone,
    wav_bytes,
)
from transformers import AutoTokenizer

TRANSCRIBE = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
MAX_TOKENS = 6


def post(*args, **kwargs) -> httpx.Response:
    """httpx.post with room for a loaded machine (its default is 5 s)."""
    kwargs.setdefault("timeout", 60)
    return httpx.post(*args, **kwargs)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return make_tiny_whisper(tmp_path_factory.mktemp("whisper"), timestamps=True)


@pytest.fixture(scope="module")
def audio_server(whisper_dir, server_process_factory):
    server = server_process_factory(
        [str(whisper_dir), "--served-model-name", "whisper", "--dtype", "float32"],
        env={"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "2"},
        log_name="audio-server.log",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(audio_server):
    return openai.OpenAI(base_url=f"{audio_server.url}/v1", api_key="none", max_retries=0)


def _expected_text(whisper_dir, samples, prompt: str = TRANSCRIBE) -> str:
    _, tokens, _ = hf_whisper_greedy(whisper_dir, samples, prompt, MAX_TOKENS)
    tokenizer = AutoTokenizer.from_pretrained(str(whisper_dir))
    return tokenizer.decode(tokens, skip_special_tokens=True)


def _transcribe(client, data: bytes, name: str = "speech.wav", **kwargs):
    return client.audio.transcriptions.create(
        model="whisper",
        file=(name, io.BytesIO(data)),
        extra_body={"max_completion_tokens": MAX_TOKENS, **kwargs.pop("extra_body", {})},
        **kwargs,
    )


def test_transcription_equals_transformers(client, whisper_dir):
    samples = tone(11, 3.0)
    answer = _transcribe(client, wav_bytes(samples))
    # the server's samples went through 16-bit PCM
    pcm = np.round(samples * 32767).clip(-32768, 32767) / 32768
    assert answer.text == _expected_text(whisper_dir, pcm.astype(np.float32))
    assert answer.text


def test_flac_at_another_rate_is_resampled(client, whisper_dir):
    from scipy.signal import resample_poly

    slow = tone(12, 2.0, 8000)
    answer = _transcribe(client, wav_bytes(slow, 8000, "FLAC"), "speech.flac")
    pcm = (np.round(slow * 32767).clip(-32768, 32767) / 32768).astype(np.float32)
    at_16k = resample_poly(pcm, 2, 1).astype(np.float32)
    assert answer.text == _expected_text(whisper_dir, at_16k)


def test_translation_language_prompt_and_text_format(client, whisper_dir):
    samples = tone(13, 2.0)
    pcm = (np.round(samples * 32767).clip(-32768, 32767) / 32768).astype(np.float32)
    text = client.audio.translations.create(
        model="whisper",
        file=("speech.wav", io.BytesIO(wav_bytes(samples))),
        response_format="text",
        prompt="the quick brown fox",
        extra_body={"language": "fr", "max_completion_tokens": MAX_TOKENS},
    )
    prompt = "<|startofprev|>the quick brown fox<|startoftranscript|><|fr|><|translate|>"
    assert text == _expected_text(whisper_dir, pcm, prompt + "<|notimestamps|>")


def test_stream_gives_the_same_text(client):
    data = wav_bytes(tone(14, 2.0))
    whole = _transcribe(client, data).text
    events = list(_transcribe(client, data, stream=True, extra_body={"stream_include_usage": True}))
    pieces = [e.choices[0]["delta"]["content"] for e in events if e.choices]
    assert "".join(pieces) == whole
    assert {e.object for e in events} == {"transcription.chunk"}
    assert events[-2].choices[0]["finish_reason"] == "length"
    assert events[-1].usage["completion_tokens"] == MAX_TOKENS


def test_translation_json_carries_no_usage(audio_server):
    answer = post(
        f"{audio_server.url}/v1/audio/translations",
        files={"file": ("a.wav", wav_bytes(tone(23, 1.0)))},
        data={"max_completion_tokens": str(MAX_TOKENS)},
    )
    assert answer.status_code == 200
    assert set(answer.json()) == {"text"}  # vLLM's: no usage for translations
    streamed = post(
        f"{audio_server.url}/v1/audio/translations",
        files={"file": ("a.wav", wav_bytes(tone(23, 1.0)))},
        data={"max_completion_tokens": str(MAX_TOKENS), "stream": "true"},
    )
    assert '"object": "translation.chunk"' in streamed.text
    assert streamed.text.endswith("data: [DONE]\n\n")


def test_audio_over_30_seconds_is_split_into_clips(client, audio_server):
    samples = tone(15, 45.0)
    samples[int(29.5 * SAMPLE_RATE) : int(29.6 * SAMPLE_RATE)] = 0  # the quiet place to cut
    first, second = samples[: int(29.5 * SAMPLE_RATE)], samples[int(29.5 * SAMPLE_RATE) :]
    texts = [_transcribe(client, wav_bytes(part)).text for part in (first, second)]
    answer = post(
        f"{audio_server.url}/v1/audio/transcriptions",
        files={"file": ("long.wav", wav_bytes(samples))},
        data={"max_completion_tokens": str(MAX_TOKENS)},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"text": "".join(texts), "usage": {"type": "duration", "seconds": 45}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the audio file is empty"),
        (b"RIFF\x10\x00\x00\x00WAVEfmt garbage", "not an audio file that can be decoded"),
        (b"%PDF-1.4 this is not audio at all" * 10, "not an audio file that can be decoded"),
        (wav_bytes(tone(16, 2.0))[:30], "not an audio file that can be decoded"),
        (wav_bytes(tone(17, 70.0)), "MiB; at most 2 MiB are taken"),
    ],
    ids=["empty", "corrupt", "not-audio", "truncated", "too-large"],
)
def test_hostile_files_are_a_400_naming_the_file(client, data, message):
    with pytest.raises(openai.BadRequestError) as error:
        _transcribe(client, data)
    assert error.value.body["param"] == "file"
    assert message in error.value.body["message"]
    assert _transcribe(client, wav_bytes(tone(18, 1.0))).text is not None  # serving on


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"language": "xx"}, "language", "language 'xx' is not one the model knows"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities", "word-level"),
        ({"timestamp_granularities[]": "segment"}, "timestamp_granularities", "verbose_json"),
        ({"response_format": "srt", "stream": "true"}, "stream", "cannot be streamed"),
        ({"temperature": "-1"}, "temperature", "greater than or equal to 0"),
    ],
)
def test_bad_fields_are_a_400_naming_them(audio_server, fields, param, message):
    answer = post(
        f"{audio_server.url}/v1/audio/transcriptions",
        files={"file": ("a.wav", wav_bytes(tone(19, 1.0)))},
        data=fields,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param
    assert message in answer.json()["error"]["message"]


TIMED = "<|startoftranscript|><|en|><|transcribe|><|0.00|>"
TIMED_TOKENS = 24


def _timed_reference(whisper_dir, samples: np.ndarray, offset: float = 0.0):
    """What the segments of ``samples`` (one clip, starting ``offset`` s into the file) hold:
    transformers' greedy tokens after the ``<|0.00|>`` prompt, cut as the server cuts them."""
    from infernetes.runtime.server.transcription_segments import clip_segments

    _, tokens, logprobs = hf_whisper_greedy(whisper_dir, samples, TIMED, TIMED_TOKENS)
    tokenizer = AutoTokenizer.from_pretrained(str(whisper_dir))
    first = tokenizer.convert_tokens_to_ids("<|0.00|>")
    seconds = len(samples) / SAMPLE_RATE
    return [
        (
            round(offset + piece.start, 2),
            round(offset + piece.end, 2),
            tokenizer.decode(piece.tokens, skip_special_tokens=True),
            piece.tokens,
            piece.avg_logprob,
        )
        for piece in clip_segments(tokens, logprobs, first, seconds)
    ]


def _pcm(samples: np.ndarray) -> np.ndarray:
    """``samples`` as the server reads them back from a 16-bit WAV file."""
    from infernetes.runtime.multimodal.audio import decode_audio

    decoded, _ = decode_audio(wav_bytes(samples))
    return decoded


def _timed(client, data: bytes, response_format: str, **kwargs):
    return client.audio.transcriptions.create(
        model="whisper",
        file=("speech.wav", io.BytesIO(data)),
        response_format=response_format,
        extra_body={"max_completion_tokens": TIMED_TOKENS},
        **kwargs,
    )


def test_verbose_json_segments_come_from_the_timestamps(client, whisper_dir):
    samples = tone(31, 4.0)
    answer = _timed(client, wav_bytes(samples), "verbose_json", timestamp_granularities=["segment"])
    expected = _timed_reference(whisper_dir, _pcm(samples))
    assert len(expected) > 1  # the tiny model writes timestamps
    got = [(s.start, s.end, s.text, s.tokens, s.avg_logprob) for s in answer.segments]
    assert [g[:4] for g in got] == [e[:4] for e in expected]
    assert [g[4] for g in got] == pytest.approx([e[4] for e in expected], abs=1e-4)
    assert [s.id for s in answer.segments] == list(range(len(expected)))
    assert {(s.seek, s.temperature, s.no_speech_prob) for s in answer.segments} == {(0, 0.0, None)}
    assert answer.segments[0].compression_ratio > 0
    assert answer.text == "".join(e[2] for e in expected)
    assert (answer.task, answer.language, answer.duration) == ("transcribe", "english", 4.0)
    assert answer.usage.seconds == 4


def test_srt_and_vtt_are_the_same_segments(client):
    data = wav_bytes(tone(32, 3.0))
    segments = _timed(client, data, "verbose_json").segments
    subrip = _timed(client, data, "srt")
    webvtt = _timed(client, data, "vtt")
    assert isinstance(subrip, str) and isinstance(webvtt, str)
    first = segments[0]
    clock = f"00:00:{first.start:06.3f} --> 00:00:{first.end:06.3f}"
    assert subrip.startswith(f"1\n{clock.replace('.', ',')}\n{first.text.strip()}\n")
    assert webvtt.startswith(f"WEBVTT\n\n{clock}\n{first.text.strip()}\n")
    assert subrip.count(" --> ") == webvtt.count(" --> ") == len(segments)


def test_long_audio_segments_are_offset_by_their_clip(audio_server, whisper_dir):
    samples = tone(33, 40.0)
    cut = int(29.5 * SAMPLE_RATE)
    samples[cut : cut + 1600] = 0  # the quiet place to cut
    answer = post(
        f"{audio_server.url}/v1/audio/translations",
        files={"file": ("long.wav", wav_bytes(samples))},
        data={"response_format": "verbose_json", "max_completion_tokens": str(TIMED_TOKENS)},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    pcm = _pcm(samples)
    prompt = TIMED.replace("transcribe", "translate")
    expected = []
    for clip, offset in ((pcm[:cut], 0.0), (pcm[cut:], 29.5)):
        _, tokens, _ = hf_whisper_greedy(whisper_dir, clip, prompt, TIMED_TOKENS)
        expected += [(start, end) for start, end, *_ in _offset(whisper_dir, tokens, clip, offset)]
    assert [(s["start"], s["end"]) for s in body["segments"]] == expected
    assert {s["seek"] for s in body["segments"]} == {0, 2950}
    assert (body["task"], body["language"], body["duration"]) == ("translate", "english", 40.0)
    assert "usage" not in body  # as a json translation, none


def _offset(whisper_dir, tokens, clip, offset):
    from infernetes.runtime.server.transcription_segments import clip_segments

    tokenizer = AutoTokenizer.from_pretrained(str(whisper_dir))
    first = tokenizer.convert_tokens_to_ids("<|0.00|>")
    pieces = clip_segments(tokens, [0.0] * len(tokens), first, len(clip) / SAMPLE_RATE)
    return [(round(offset + p.start, 2), round(offset + p.end, 2)) for p in pieces]


def test_a_missing_file_is_a_400(audio_server):
    answer = post(f"{audio_server.url}/v1/audio/transcriptions", data={"model": "whisper"})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "file"


def test_two_files_or_a_malformed_form_are_a_400(audio_server):
    url = f"{audio_server.url}/v1/audio/transcriptions"
    data = wav_bytes(tone(21, 1.0))
    two = post(url, files=[("file", ("a.wav", data)), ("file", ("b.wav", data))])
    assert two.status_code == 400
    assert "files" in two.json()["error"]["message"]
    malformed = post(
        url,
        content=b'--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nabc',
        headers={"Content-Type": "multipart/form-data; boundary=xyz"},
    )
    assert malformed.status_code == 400


def test_health_answers_while_audio_is_processed(client, audio_server):
    data = wav_bytes(tone(20, 60.0))  # decoded, resampled and featurized in two clips
    done = threading.Event()
    polls_during = 0

    def transcribe():
        try:
            return post(
                f"{audio_server.url}/v1/audio/transcriptions",
                files={"file": ("a.wav", data)},
                data={"max_completion_tokens": str(MAX_TOKENS)},
                timeout=60,
            )
        finally:
            done.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(transcribe)
        with httpx.Client(base_url=audio_server.url, timeout=1.0) as http:
            while not done.is_set():
                assert http.get("/health").status_code == 200
                polls_during += not done.is_set()
        assert answer.result().status_code == 200
    assert polls_during > 0


@pytest.mark.parametrize("route", ["transcriptions", "translations"])
def test_a_text_model_refuses_the_audio_routes_naming_model(main_server, auth_headers, route):
    answer = post(
        f"{main_server.url}/v1/audio/{route}",
        files={"file": ("a.wav", wav_bytes(tone(22, 1.0)))},
        headers=auth_headers,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "model"
    assert "does not transcribe audio" in answer.json()["error"]["message"]
