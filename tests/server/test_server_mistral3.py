"""Mistral 3 with images behind the chat API, with the openai client: data: URIs of images of
different sizes (grids of their own shapes) equal transformers' continuation, and
``--mm-processor-kwargs`` (``size``'s longest edge) resizes them as the image processor does."""

from __future__ import annotations

import json

import openai
import pytest
from infernetes.runtime.testing_vision import (
    hf_llava_greedy,
    hf_processor,
    make_tiny_mistral3,
    png_data_url,
    random_image,
)

MAX_TOKENS = 6
PROCESSOR_KWARGS = {"size": {"longest_edge": 32}}  # the tiny model's default is 48


@pytest.fixture(scope="module")
def mistral3_dir(tmp_path_factory):
    return make_tiny_mistral3(tmp_path_factory.mktemp("mistral3"))


@pytest.fixture(scope="module")
def client(mistral3_dir, server_process_factory):
    server = server_process_factory(
        [
            str(mistral3_dir),
            "--served-model-name",
            "mistral3",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--mm-processor-kwargs",
            json.dumps(PROCESSOR_KWARGS),
        ],
        log_name="mistral3-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


@pytest.mark.parametrize("sizes", [[(40, 36)], [(70, 50), (30, 90)]], ids=["one", "two"])
def test_chat_with_images_equals_transformers(client, mistral3_dir, sizes):
    images = [random_image(30 + i, size) for i, size in enumerate(sizes)]
    parts = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in images]
    response = client.chat.completions.create(
        model="mistral3",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    text = f"<|im_start|>user\nLook:{'[IMG]' * len(images)}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, tokens, logprobs = hf_llava_greedy(
        mistral3_dir, text, images, MAX_TOKENS, add_special_tokens=False, **PROCESSOR_KWARGS
    )
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    expected = (
        hf_processor(str(mistral3_dir))
        .tokenizer.decode(tokens, skip_special_tokens=True)
        .rstrip("\ufffd")
    )
    assert response.choices[0].message.content.rstrip("\ufffd") == expected
    assert response.usage.prompt_tokens == len(prompt_ids)
    unbounded = hf_processor(str(mistral3_dir))(text=text, images=images, add_special_tokens=False)
    assert len(prompt_ids) < unbounded["input_ids"].shape[1]  # each image scaled down


def test_an_image_for_a_prompt_over_the_context_is_a_400(client):
    # 40 wide images of 5 x 6 merged patches: 1,200 placeholder tokens
    parts = [{"type": "image_url", "image_url": {"url": png_data_url(random_image(1, (70, 50)))}}]
    with pytest.raises(openai.BadRequestError, match=r"maximum model length|context"):
        client.chat.completions.create(
            model="mistral3",
            messages=[{"role": "user", "content": parts * 40}],
            max_tokens=1,
        )
