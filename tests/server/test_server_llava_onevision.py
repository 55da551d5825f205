"""LLaVA-OneVision served through the chat API with the openai client: an ``image_url`` alone,
two of them (each then squared and untiled), and a ``video_url`` (an mp4 made here, its frames
kept by the loader's ``--media-io-kwargs`` video.num_frames) give transformers' greedy tokens
and logprobs for the same inputs (transformers fed the stand-in processor's arrays)."""

from __future__ import annotations

import base64
import json

import openai
import pytest
from infernetes.runtime.multimodal.video import even_indices
from infernetes.runtime.testing_vision import (
    decoded_frames,
    hf_llava_greedy,
    make_tiny_llava_onevision,
    make_video,
    png_data_url,
    random_image,
)

MAX_TOKENS = 5
LOADER_FRAMES = 4
SOURCE_FRAMES, SOURCE_FPS = 9, 5


@pytest.fixture(scope="module")
def onevision_dir(tmp_path_factory):
    return make_tiny_llava_onevision(tmp_path_factory.mktemp("onevision"))


@pytest.fixture(scope="module")
def client(onevision_dir, server_process_factory):
    server = server_process_factory(
        [
            str(onevision_dir),
            "--served-model-name",
            "onevision",
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--media-io-kwargs",
            json.dumps({"video": {"num_frames": LOADER_FRAMES}}),
        ],
        log_name="llava-onevision-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


def _chat(client, parts: list[dict]) -> tuple[int, list[float]]:
    response = client.chat.completions.create(
        model="onevision",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    return response.usage.prompt_tokens, served


def _image_part(image) -> dict:
    return {"type": "image_url", "image_url": {"url": png_data_url(image)}}


@pytest.mark.parametrize("count", [1, 2])
def test_images_equal_transformers(client, onevision_dir, count):
    images = [random_image(41, (100, 30)), random_image(42, (40, 64))][:count]
    prompt_tokens, served = _chat(client, [_image_part(image) for image in images])
    text = f"<|im_start|>user\nLook:{'<image>' * count}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, _, logprobs = hf_llava_greedy(
        onevision_dir, text, images, MAX_TOKENS, add_special_tokens=False
    )
    assert prompt_tokens == len(prompt_ids)
    assert served == pytest.approx(logprobs, abs=1e-4)


def test_video_url_equals_transformers(client, onevision_dir):
    data = make_video(SOURCE_FRAMES, SOURCE_FPS)
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    prompt_tokens, served = _chat(client, [{"type": "video_url", "video_url": {"url": url}}])
    frames = decoded_frames(data, even_indices(SOURCE_FRAMES, LOADER_FRAMES))
    text = "<|im_start|>user\nLook:<video><|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, _, logprobs = hf_llava_greedy(
        onevision_dir, text, [], MAX_TOKENS, videos=[frames], add_special_tokens=False
    )
    assert prompt_tokens == len(prompt_ids)
    assert served == pytest.approx(logprobs, abs=1e-4)
