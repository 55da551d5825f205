"""Audio through the chat API of a server running a tiny Qwen2-Audio, with the openai client's
own request shape: ``input_audio`` parts (base64 WAV) equal transformers' continuation, one clip
and two between text; ``audio_url`` parts as data: URIs, file:// under
--allowed-local-media-path and http(s) URLs (within VLLM_AUDIO_FETCH_TIMEOUT); the Responses
API's ``input_audio``; --limit-mm-per-prompt; hostile audio (empty, corrupt, not audio, too
long, over VLLM_MAX_AUDIO_CLIP_FILESIZE_MB, a bad format) each a 400 naming the part, the server
serving on; a text model refuses an audio part."""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.chat_parts import split_content
from infernetes.runtime.testing_audio import (
    QWEN_AUDIO,
    make_tiny_qwen2_audio,
    tone,
    wav_bytes,
)
from infernetes.runtime.testing_vision import hf_llava_greedy, hf_processor

MAX_TOKENS = 6
PART = "messages[0].content[1]"


@pytest.fixture(scope="module")
def qwen_audio_dir(tmp_path_factory):
    return make_tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2_audio"))


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("audio_media")


@pytest.fixture(scope="module")
def audio_server(qwen_audio_dir, media_dir, server_process_factory):
    server = server_process_factory(
        [
            str(qwen_audio_dir),
            "--served-model-name",
            "qwen-audio",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--limit-mm-per-prompt",
            json.dumps({"audio": 2}),
            "--allowed-local-media-path",
            str(media_dir),
        ],
        env={"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1", "VLLM_AUDIO_FETCH_TIMEOUT": "1"},
        log_name="qwen2-audio-server.log",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(audio_server):
    return openai.OpenAI(base_url=f"{audio_server.url}/v1", api_key="none", max_retries=0)


def _read_back(samples: np.ndarray) -> np.ndarray:
    """``samples`` as a WAV file (16-bit PCM) holds them, read back by soundfile."""
    import soundfile

    read, _ = soundfile.read(io.BytesIO(wav_bytes(samples)), dtype="float32")
    return read


def _input_audio(data: bytes, audio_format: str = "wav") -> dict:
    """An ``input_audio`` part, as the openai client sends it."""
    encoded = base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": audio_format}}


def _audio_url(url: str) -> dict:
    return {"type": "audio_url", "audio_url": {"url": url}}


def _data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _chat(client, parts: list[dict], **extra):
    return client.chat.completions.create(
        model="qwen-audio",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hear:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
        **extra,
    )


def _expected(qwen_audio_dir, clips: list[np.ndarray], between: str = ""):
    audio = between.join([QWEN_AUDIO] * len(clips))
    text = f"<|im_start|>user\nHear:{audio}<|im_end|>\n<|im_start|>assistant\n"
    return hf_llava_greedy(
        qwen_audio_dir, text, [], MAX_TOKENS, audio=[_read_back(clip) for clip in clips]
    )


def _assert_equals(response, qwen_audio_dir, expected) -> None:
    prompt_ids, tokens, logprobs = expected
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    text = hf_processor(str(qwen_audio_dir)).tokenizer.decode(tokens).rstrip("\ufffd")
    assert response.choices[0].message.content.rstrip("\ufffd") == text
    assert response.usage.prompt_tokens == len(prompt_ids)


def test_input_audio_equals_transformers(client, qwen_audio_dir):
    clip = tone(21, 1.5)
    response = _chat(client, [_input_audio(wav_bytes(clip))])
    _assert_equals(response, qwen_audio_dir, _expected(qwen_audio_dir, [clip]))


def test_two_clips_between_text_equal_transformers(client, qwen_audio_dir):
    clips = [tone(22, 0.8), tone(23, 2.0)]
    parts = [
        _input_audio(wav_bytes(clips[0])),
        {"type": "text", "text": " then "},
        _input_audio(wav_bytes(clips[1])),
    ]
    response = _chat(client, parts)
    _assert_equals(response, qwen_audio_dir, _expected(qwen_audio_dir, clips, " then "))


def test_audio_urls_data_and_file_answer_as_input_audio(client, media_dir):
    data = wav_bytes(tone(24, 1.0))
    (media_dir / "clip.wav").write_bytes(data)
    answers = {
        _chat(client, [part]).choices[0].message.content
        for part in (
            _input_audio(data),
            _audio_url(_data_url(data)),
            _audio_url(f"file://{media_dir / 'clip.wav'}"),
        )
    }
    assert len(answers) == 1
    with pytest.raises(openai.BadRequestError, match="outside --allowed-local-media-path") as error:
        _chat(client, [_audio_url(f"file://{media_dir.parent}/elsewhere.wav")])
    assert error.value.body["param"] == PART


class _AudioHandler(http.server.BaseHTTPRequestHandler):
    clip = wav_bytes(tone(25, 1.0))

    def do_GET(self) -> None:  # http.server's name
        if self.path == "/slow.wav":
            time.sleep(3)  # past the server's VLLM_AUDIO_FETCH_TIMEOUT of 1 s
        self.send_response(200)
        self.send_header("Content-Type", "audio/wav")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(self.clip)

    def log_message(self, *args) -> None:  # quiet
        pass


def test_http_audio_urls_within_the_fetch_timeout(client):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AudioHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        fetched = _chat(client, [_audio_url(f"{base}/clip.wav")]).choices[0].message.content
        given = _chat(client, [_input_audio(_AudioHandler.clip)]).choices[0].message.content
        assert fetched == given
        with pytest.raises(openai.BadRequestError, match="VLLM_AUDIO_FETCH_TIMEOUT") as error:
            _chat(client, [_audio_url(f"{base}/slow.wav")])
        assert error.value.body["param"] == PART
    finally:
        server.shutdown()


def test_responses_input_audio(client):
    content = [
        {"type": "input_text", "text": "Hear:"},
        _input_audio(wav_bytes(tone(26, 1.0))),
    ]
    response = client.responses.create(
        model="qwen-audio",
        input=[{"role": "user", "content": content}],
        max_output_tokens=4,
        temperature=0.0,
    )
    assert response.usage.input_tokens > 25  # the clip's 25 tokens and the text
    assert response.usage.output_tokens == 4


def test_limit_mm_per_prompt(client):
    clip = _input_audio(wav_bytes(tone(27, 0.5)))
    with pytest.raises(openai.BadRequestError, match=r"At most 2 audio clip\(s\)"):
        _chat(client, [clip, clip, clip])


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (lambda: _input_audio(b""), "the audio file is empty"),
        (lambda: _input_audio(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(20)), "not an audio file"),
        (lambda: _input_audio(wav_bytes(tone(1))[:60]), r"content\[1\]: the clip is too short"),
        (lambda: _input_audio(b"\x89PNG not audio at all"), "not an audio file that can be"),
        (lambda: _input_audio(wav_bytes(tone(1, 31.0))), r"31\.0 s of audio .* at most 30 s"),
        (
            lambda: _input_audio(wav_bytes(np.stack([tone(1, 12.0, 48000)] * 2, 1), 48000)),
            r"MiB of audio; at most 1 MiB .*VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
        ),
        (lambda: _input_audio(wav_bytes(tone(1)), "../wav"), "input_audio.format must be"),
        (lambda: {"type": "input_audio", "input_audio": "abc"}, 'needs "input_audio"'),
        (lambda: _audio_url(_data_url(b"text", "text/plain")), "'text/plain' is not an audio"),
        (lambda: _audio_url("data:audio/wav;base64,***"), "not valid base64"),
    ],
)
def test_hostile_audio_is_a_400_naming_the_part(client, audio_server, part, message):
    with pytest.raises(openai.BadRequestError, match=message) as error:
        _chat(client, [part()])
    assert error.value.body["param"] == PART
    assert httpx.get(f"{audio_server.url}/health").status_code == 200
    response = _chat(client, [_input_audio(wav_bytes(tone(28, 0.5)))])
    assert response.usage.completion_tokens == MAX_TOKENS


def test_a_text_model_refuses_audio_parts(main_server):
    client = openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )
    with pytest.raises(openai.BadRequestError, match="this model takes text only") as error:
        client.chat.completions.create(
            model="tiny",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hear:"},
                        _input_audio(wav_bytes(tone(29, 0.5))),
                    ],
                }
            ],
            max_tokens=2,
        )
    assert error.value.body["param"] == PART


def test_an_audio_part_to_an_image_model_is_refused():
    parts = [_input_audio(b"x")]
    with pytest.raises(RequestError, match="takes image only; input_audio parts") as error:
        split_content(parts, "messages[0].content", "openai", [], {"image": "<image>"})
    assert error.value.param == "messages[0].content[0]"
