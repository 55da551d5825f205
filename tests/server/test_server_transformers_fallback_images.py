"""An image-text-to-text model with no native implementation (Aya Vision) served through the
transformers fallback, with the openai client: a chat image, one tile or a wide image's
several, equals transformers' continuation; a modality it does not take is a 400 naming the
part, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest
from infernetes.runtime.testing_vision import (
    hf_llava_greedy,
    hf_processor,
    make_tiny_aya_vision,
    png_data_url,
    random_image,
)

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def aya_dir(tmp_path_factory):
    return make_tiny_aya_vision(tmp_path_factory.mktemp("aya"))


@pytest.fixture(scope="module")
def client(aya_dir, server_process_factory):
    server = server_process_factory(
        [
            str(aya_dir),
            "--served-model-name",
            "aya",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
        ],
        log_name="aya-server.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


def _chat(client, parts):
    return client.chat.completions.create(
        model="aya",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )


def _image_part(image) -> dict:
    return {"type": "image_url", "image_url": {"url": png_data_url(image)}}


@pytest.mark.parametrize("size", [(40, 36), (96, 30)], ids=["one-tile", "wide"])
def test_chat_with_an_image_equals_transformers(client, aya_dir, size):
    # the processor's own settings: a wide image is 3 tiles and a global one
    image = random_image(31, size)
    response = _chat(client, [_image_part(image)])
    text = "<|im_start|>user\nLook:<image><|im_end|>\n<|im_start|>assistant\n"
    prompt_ids, tokens, logprobs = hf_llava_greedy(
        aya_dir, text, [image], MAX_TOKENS, add_special_tokens=False
    )
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    expected = hf_processor(str(aya_dir)).decode(tokens).rstrip("\ufffd")
    assert response.choices[0].message.content.rstrip("\ufffd") == expected
    assert response.usage.prompt_tokens == len(prompt_ids)


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
            r"messages\[0\].content\[1\]: this model takes image only; video_url parts",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            r"messages\[0\].content\[1\]: this model takes image only; input_audio parts",
        ),
    ],
)
def test_what_the_model_cannot_take_is_a_400(client, part, message):
    with pytest.raises(openai.BadRequestError, match=message):
        _chat(client, [part])
    response = _chat(client, [_image_part(random_image(33))])  # still serving
    assert len(response.choices[0].logprobs.content) == MAX_TOKENS
