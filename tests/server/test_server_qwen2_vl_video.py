"""Qwen2.5-VL with ``video_url`` chat parts, with the openai client: an mp4 made here with PyAV
(frames of a few colours), sent as a ``data:`` URI, a ``file://`` URL under
``--allowed-local-media-path`` and an ``http://`` URL (within ``VLLM_VIDEO_FETCH_TIMEOUT``), gives the greedy tokens and logprobs of the same frames given
offline (the loader's ``--media-io-kwargs`` video.num_frames spread evenly, spaced in time at the
rate they were kept at; with ``do_sample_frames`` Qwen2-VL's processor's ``fps`` rule on top);
hostile videos get a 400 naming the part, and /health answers while a large one is decoded."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.server
import io
import json
import threading
import time

import httpx
import openai
import pytest
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.multimodal.chat_parts import split_content
from infernetes.runtime.multimodal.video import (
    DecodedVideo,
    decode_video,
    even_indices,
    loader_frames,
    processor_picks,
)
from infernetes.runtime.preflight import check_settings
from infernetes.runtime.testing_vision import (
    QWEN_VIDEO,
    decoded_frames,
    make_tiny_qwen2_vl,
    make_video,
)

from infernetes import LLM, SamplingParams
from infernetes.schema.config import build_config

MAX_TOKENS = 5
LOADER_FRAMES = 6
SOURCE_FRAMES, SOURCE_FPS = 10, 5
ENGINE = ["--dtype", "float32", "--max-model-len", "512", "--block-size", "8"]


def data_url(data: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def messages(url: str) -> list[dict]:
    part = {"type": "video_url", "video_url": {"url": url}}
    return [{"role": "user", "content": [{"type": "text", "text": "What:"}, part]}]


PROMPT = f"<|im_start|>user\nWhat:{QWEN_VIDEO}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen2_5_vl"), version="2.5")


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("media")


class _VideoHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name
        if self.path == "/slow.mp4":
            time.sleep(3)
        body = make_video(SOURCE_FRAMES, SOURCE_FPS)
        self.send_response(200)
        self.send_header("Content-Type", "video/mp4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the slow one's reader has given up
            self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def video_host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _VideoHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def server(qwen_dir, media_dir, server_process_factory):
    process = server_process_factory(
        [
            str(qwen_dir),
            "--served-model-name",
            "qwen",
            *ENGINE,
            "--media-io-kwargs",
            json.dumps({"video": {"num_frames": LOADER_FRAMES}}),
            "--allowed-local-media-path",
            str(media_dir),
            "--trust-request-mm-kwargs",
        ],
        env={"VLLM_VIDEO_FETCH_TIMEOUT": "1"},
        log_name="qwen2-vl-video-server.log",
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def offline(qwen_dir):
    return LLM(str(qwen_dir), dtype="float32", max_model_len=512, block_size=8)


def chat(client, url: str, **extra):
    response = client.chat.completions.create(
        model="qwen",
        messages=messages(url),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        # as the offline prompt's text is tokenized (with the tokenizer's BOS)
        extra_body={"ignore_eos": True, "add_special_tokens": True, **extra},
    )
    choice = response.choices[0]
    return choice.message.content, [entry.logprob for entry in choice.logprobs.content]


def offline_greedy(llm, frames: list, fps: float):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    prompt = {
        "prompt": PROMPT,
        "multi_modal_data": {"video": frames},
        "mm_processor_kwargs": {"fps": fps},
    }
    [output] = llm.generate(prompt, params, use_tqdm=False)
    completion = output.outputs[0]
    logprobs = [
        entry[token].logprob
        for entry, token in zip(completion.logprobs, completion.token_ids, strict=True)
    ]
    return completion.text, logprobs


def test_loader_and_processor_sampling_follow_vllm_and_qwen():
    assert even_indices(10, 6) == [0, 1, 3, 5, 7, 9]
    assert even_indices(4, 6) == [0, 1, 2, 3]
    assert even_indices(5, -1) == [0, 1, 2, 3, 4]
    video = DecodedVideo(list(range(6)), 5.0, 10, [0, 1, 3, 5, 7, 9])
    assert video.sampled_fps == 3.0
    # fps 2 over 6 frames at 3 a second: 4 frames (at least min_frames 4, a multiple of 2)
    assert processor_picks(video, {"do_sample_frames": True, "fps": 2}, 2, "v") == [0, 1, 3, 4]
    assert processor_picks(video, {"do_sample_frames": True, "num_frames": 3}, 2, "v") == [
        0,
        1,
        3,
        4,
    ]
    assert processor_picks(video, {"fps": 2}, 2, "v") == list(range(6))  # not sampling
    with pytest.raises(RequestError, match="fps and num_frames are exclusive"):
        processor_picks(video, {"do_sample_frames": True, "fps": 1, "num_frames": 4}, 2, "v")
    with pytest.raises(RequestError, match="takes 8 of its 6 frames"):
        processor_picks(video, {"do_sample_frames": True, "num_frames": 8}, 2, "v")


def test_loader_settings_refuse_unknown_keys():
    assert loader_frames(None) == 32  # vLLM's default
    assert loader_frames({"video": {"num_frames": -1}}) == -1
    with pytest.raises(
        ValueError, match=r"media_io_kwargs\.video\.fps: not a video loader setting"
    ):
        loader_frames({"video": {"fps": 2}})
    with pytest.raises(ValueError, match=r"media_io_kwargs\.image: not honoured here"):
        loader_frames({"image": {"rgba_background_color": [0, 0, 0]}})
    with pytest.raises(ValueError, match=r"media_io_kwargs\.video\.num_frames: -1"):
        loader_frames({"video": {"num_frames": 0}})
    # as `infernetes serve` checks its settings before it starts (exit 2 with the message)
    config = build_config("org/model", media_io_kwargs={"video": {"num_fraems": 8}})
    with pytest.raises(ValueError, match=r"media_io_kwargs\.video\.num_fraems"):
        check_settings(config, {})


def test_video_url_equals_the_same_frames_offline(client, offline, media_dir, video_host):
    data = make_video(SOURCE_FRAMES, SOURCE_FPS)
    kept = even_indices(SOURCE_FRAMES, LOADER_FRAMES)
    frames = decoded_frames(data, kept)
    expected_text, expected_logprobs = offline_greedy(
        offline, frames, len(kept) / SOURCE_FRAMES * SOURCE_FPS
    )
    text, logprobs = chat(client, data_url(data))
    assert text == expected_text
    assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    (media_dir / "clip.mp4").write_bytes(data)
    assert chat(client, f"file://{media_dir / 'clip.mp4'}")[0] == expected_text
    assert chat(client, f"{video_host}/clip.mp4")[0] == expected_text
    with pytest.raises(openai.BadRequestError, match=r"VLLM_VIDEO_FETCH_TIMEOUT \(1 s\)"):
        chat(client, f"{video_host}/slow.mp4")


def test_processor_sampling_at_an_fps_equals_its_frames_offline(client, offline):
    data = make_video(SOURCE_FRAMES, SOURCE_FPS)
    # the loader keeps frames 0 1 3 5 7 9 (3 a second); 2 a second of them: 0 1 5 7
    frames = decoded_frames(data, [0, 1, 5, 7])
    expected_text, expected_logprobs = offline_greedy(offline, frames, 2.0)
    text, logprobs = chat(
        client, data_url(data), mm_processor_kwargs={"do_sample_frames": True, "fps": 2}
    )
    assert text == expected_text
    assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, "PNG")
    return buffer.getvalue()


HOSTILE = {
    "corrupt": (data_url(make_video(4, 4)[:300]), "not a video this server can read"),
    "noise": (data_url(bytes(range(256)) * 8), "not a video this server can read"),
    "no_frames": (data_url(make_video(0, 4, fmt="avi"), "video/x-msvideo"), "has no frames"),
    "an_image": (data_url(_png()), "the data is not a video"),
    "not_a_video_type": (data_url(b"hello", "text/plain"), "not a video type"),
    "outside_the_media_path": ("file:///etc/hostname", "outside --allowed-local-media-path"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_videos_get_a_400_naming_the_part(client, server, case):
    url, message = HOSTILE[case]
    with pytest.raises(openai.BadRequestError, match=message) as error:
        chat(client, url)
    assert error.value.body["param"] == "messages[0].content[1]"
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_more_frames_than_allowed_are_refused_before_decoding():
    data = make_video(12, 4, size=(16, 16))
    with pytest.raises(RequestError, match="12 frames would be kept; at most 8") as error:
        decode_video(data, "video/mp4", "messages[0].content[1]", -1, 8, 10**6)
    assert error.value.param == "messages[0].content[1]"
    with pytest.raises(RequestError, match="its frames have 16 x 16 pixels; at most 100"):
        decode_video(data, "video/mp4", "part", 4, 8, 100)


def test_health_answers_while_a_large_video_is_decoded(client, server):
    # 64 frames of 1280 x 720: a second or more of decoding and resizing on the API side
    url = data_url(make_video(64, 8, size=(1280, 720)))
    polls_during = 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, client, url)
        with httpx.Client(base_url=server.url, timeout=1.0) as http:
            while not answer.done():
                # a loop blocked by the decoding would leave this unanswered past the 1 s timeout
                assert http.get("/health").status_code == 200
                polls_during += not answer.done()
        assert answer.result()[0] is not None
    assert polls_during > 0


def test_a_video_part_to_a_model_without_videos_is_refused():
    parts = [{"type": "video_url", "video_url": {"url": data_url(b"x")}}]
    with pytest.raises(RequestError, match="this model takes image only; video_url parts") as error:
        split_content(parts, "messages[0].content", "openai", [], {"image": "<image>"})
    assert error.value.param == "messages[0].content[0]"
    with pytest.raises(RequestError, match="this model takes text only"):
        split_content(parts, "messages[0].content", "openai", [], None)
