"""Gemma 3 with images behind the chat API, with the openai client: data: URIs equal
transformers' continuation, and ``--mm-processor-kwargs`` turns pan-and-scan on (a wide image's
crops each become an image of their own)."""

from __future__ import annotations

import json

import openai
import pytest
from infernetes.runtime.testing_vision import (
    GEMMA3_BOI,
    GEMMA3_TOKENS_PER_IMAGE,
    hf_llava_greedy,
    hf_processor,
    make_tiny_gemma3,
    png_data_url,
    random_image,
)

MAX_TOKENS = 6
PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    return make_tiny_gemma3(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def client(gemma3_dir, server_process_factory):
    server = server_process_factory(
        [
            str(gemma3_dir),
            "--served-model-name",
            "gemma3",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--mm-processor-kwargs",
            json.dumps(PAN_AND_SCAN),
        ],
        log_name="gemma3-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


@pytest.mark.parametrize("sizes", [[(40, 36)], [(40, 36), (96, 30)]], ids=["one", "wide"])
def test_chat_with_images_equals_transformers(client, gemma3_dir, sizes):
    images = [random_image(30 + i, size) for i, size in enumerate(sizes)]
    parts = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in images]
    response = client.chat.completions.create(
        model="gemma3",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    text = f"<|im_start|>user\nLook:{GEMMA3_BOI * len(images)}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, tokens, logprobs = hf_llava_greedy(
        gemma3_dir, text, images, MAX_TOKENS, add_special_tokens=False, **PAN_AND_SCAN
    )
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    expected = hf_processor(str(gemma3_dir)).decode(tokens).rstrip("\ufffd")
    assert response.choices[0].message.content.rstrip("\ufffd") == expected
    assert response.usage.prompt_tokens == len(prompt_ids)
    if len(images) > 1:  # the wide image's crops were made
        assert response.usage.prompt_tokens > 4 * GEMMA3_TOKENS_PER_IMAGE
