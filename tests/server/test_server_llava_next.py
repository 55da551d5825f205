"""LLaVA-NeXT served: two images of different sizes (different tilings, different placeholder
counts) in one chat message through the openai client equal transformers' greedy tokens and
logprobs."""

from __future__ import annotations

import openai
import pytest
from infernetes.runtime.testing_vision import (
    hf_llava_greedy,
    hf_processor,
    make_tiny_llava_next,
    png_data_url,
    random_image,
)

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def llava_next_dir(tmp_path_factory):
    return make_tiny_llava_next(tmp_path_factory.mktemp("llava_next"))


@pytest.fixture(scope="module")
def client(llava_next_dir, server_process_factory):
    server = server_process_factory(
        [str(llava_next_dir), "--served-model-name", "next", "--dtype", "float32"],
        log_name="llava-next-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


def test_two_images_of_different_sizes_equal_transformers(client, llava_next_dir):
    images = [random_image(31, (100, 30)), random_image(32, (40, 64))]
    parts = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in images]
    response = client.chat.completions.create(
        model="next",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    text = "<|im_start|>user\nLook:<image><image><|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, tokens, logprobs = hf_llava_greedy(
        llava_next_dir, text, images, MAX_TOKENS, add_special_tokens=False
    )
    assert response.usage.prompt_tokens == len(prompt_ids)
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    # the same tokens: their text (the detokenizer may hold back the tail of an unfinished word)
    expected = hf_processor(str(llava_next_dir)).decode(tokens)
    served_text = response.choices[0].message.content.rstrip("\ufffd")
    assert served_text and expected.startswith(served_text)
