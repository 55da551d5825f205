"""Qwen2.5-VL and Qwen3-VL with images behind the chat API, with the openai client: data: URIs of images of
different sizes (so different grids) equal transformers' continuation, and
``--mm-processor-kwargs`` (``size``'s pixel bounds) resizes them as the image processor does."""

from __future__ import annotations

import json

import openai
import pytest
from infernetes.runtime.testing_vision import (
    QWEN_IMAGE,
    hf_llava_greedy,
    hf_processor,
    make_tiny_qwen2_vl,
    png_data_url,
    random_image,
)

MAX_TOKENS = 6
# at most 2048 pixels, so the larger images are scaled down (transformers' spelling of
# max_pixels, which it deprecates)
PROCESSOR_KWARGS = {"size": {"shortest_edge": 256, "longest_edge": 2048}}


@pytest.fixture(scope="module", params=["2.5", "3"], ids=["qwen2_5_vl", "qwen3_vl"])
def qwen_dir(request, tmp_path_factory):
    return make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen_vl"), version=request.param)


@pytest.fixture(scope="module")
def client(qwen_dir, server_process_factory):
    server = server_process_factory(
        [
            str(qwen_dir),
            "--served-model-name",
            "qwen",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--mm-processor-kwargs",
            json.dumps(PROCESSOR_KWARGS),
        ],
        log_name="qwen2-vl-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


@pytest.mark.parametrize("sizes", [[(40, 36)], [(70, 50), (30, 90)]], ids=["one", "two"])
def test_chat_with_images_equals_transformers(client, qwen_dir, sizes):
    images = [random_image(30 + i, size) for i, size in enumerate(sizes)]
    parts = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in images]
    response = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    text = f"<|im_start|>user\nLook:{QWEN_IMAGE * len(images)}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, tokens, logprobs = hf_llava_greedy(
        qwen_dir, text, images, MAX_TOKENS, add_special_tokens=False, **PROCESSOR_KWARGS
    )
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    expected = hf_processor(str(qwen_dir)).tokenizer.decode(tokens).rstrip("\ufffd")
    assert response.choices[0].message.content.rstrip("\ufffd") == expected
    assert response.usage.prompt_tokens == len(prompt_ids)
    unbounded = hf_processor(str(qwen_dir))(text=text, images=images, add_special_tokens=False)
    assert (len(prompt_ids) < unbounded["input_ids"].shape[1]) == (len(images) > 1)


def test_an_unknown_processor_argument_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="processor"):
        client.chat.completions.create(
            model="qwen",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": png_data_url(random_image(1))}}
                    ],
                }
            ],
            max_tokens=1,
            extra_body={"mm_processor_kwargs": {"no_such_setting": 3}},
        )
