"""Images through the chat API of a server running a tiny LLaVA, with the openai client: data:
URIs (PNG, JPEG), file:// under --allowed-local-media-path, http(s) URLs from a local server
(domains, redirects, timeouts), --limit-mm-per-prompt, the Responses API's input_image, and
hostile media (truncated, corrupt, decompression bombs, a MIME type that lies): each a 400
naming the part, the server serving on; a repeated image hits the processor cache
(vllm:mm_cache_*), and /health answers while a large image is processed."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.server
import io
import threading
import time

import httpx
import openai
import pytest
from infernetes.runtime.testing_vision import (
    hf_llava_greedy,
    hf_processor,
    make_tiny_llava,
    random_image,
)
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

MAX_TOKENS = 6
PART = "messages[0].content[1]"


def _encoded(image, kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, kind)
    return buffer.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _messages(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}]


def _chat_text(num_images: int) -> str:
    return f"<|im_start|>user\nLook:{'<image>' * num_images}<|im_end|>\n<|im_start|>assistant\n"


class _MediaHandler(http.server.BaseHTTPRequestHandler):
    image = _encoded(random_image(21))

    def do_GET(self) -> None:  # http.server's name
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/image.png")
            self.end_headers()
            return
        if self.path == "/slow.png":
            time.sleep(3)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.image)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the slow one's reader has given up
            self.wfile.write(self.image)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def media_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MediaHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("media")
    (directory / "local.png").write_bytes(_encoded(random_image(22)))
    return directory


@pytest.fixture(scope="module")
def vision_server(llava_dir, media_dir, server_process_factory):
    server = server_process_factory(
        [
            str(llava_dir),
            "--served-model-name",
            "llava",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--limit-mm-per-prompt",
            '{"image": 2}',
            "--allowed-local-media-path",
            str(media_dir),
            "--allowed-media-domains",
            "127.0.0.1",
            "--trust-request-mm-kwargs",
        ],
        env={"VLLM_IMAGE_FETCH_TIMEOUT": "1"},
        log_name="vision-server.log",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def untrusting_client(llava_dir, server_process_factory):
    """A server with the defaults: no request processor settings, no file:// URLs."""
    server = server_process_factory(
        [str(llava_dir), "--served-model-name", "llava", "--dtype", "float32"],
        log_name="vision-server-defaults.log",
    )
    try:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    finally:
        server.stop()


def test_file_urls_need_the_flag(untrusting_client):
    with pytest.raises(openai.BadRequestError, match="--allowed-local-media-path") as error:
        _chat(untrusting_client, _messages("file:///etc/hostname"))
    assert error.value.body["param"] == PART


@pytest.fixture(scope="module")
def client(vision_server):
    return openai.OpenAI(base_url=f"{vision_server.url}/v1", api_key="none", max_retries=0)


def _chat(client, messages, **extra):
    return client.chat.completions.create(
        model="llava",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True, **extra},
    )


def _assert_equals_transformers(llava_dir, response, images, **processor_kwargs) -> None:
    _, tokens, logprobs = hf_llava_greedy(
        llava_dir,
        _chat_text(len(images)),
        images,
        MAX_TOKENS,
        add_special_tokens=False,
        **processor_kwargs,
    )
    served = [entry.logprob for entry in response.choices[0].logprobs.content]
    assert served == pytest.approx(logprobs, abs=1e-4)
    # the same tokens: their text (a last byte of an unfinished character is held back)
    text = hf_processor(str(llava_dir)).decode(tokens).rstrip("\ufffd")
    assert response.choices[0].message.content.rstrip("\ufffd") == text


def test_data_urls_png_and_jpeg_equal_transformers(client, llava_dir):
    png, jpeg = random_image(23), random_image(24)
    jpeg_bytes = _encoded(jpeg, "JPEG")
    response = _chat(
        client, _messages(_data_url(_encoded(png)), _data_url(jpeg_bytes, "image/jpeg"))
    )
    decoded = Image.open(io.BytesIO(jpeg_bytes)).convert("RGB")  # what the server sees
    _assert_equals_transformers(llava_dir, response, [png, decoded])
    assert response.usage.prompt_tokens > 2 * 16  # each image's 16 feature tokens


def test_file_urls_only_under_the_allowed_path(client, llava_dir, media_dir, tmp_path):
    response = _chat(client, _messages(f"file://{media_dir}/local.png"))
    _assert_equals_transformers(llava_dir, response, [random_image(22)])
    outside = tmp_path / "outside.png"
    outside.write_bytes(_encoded(random_image(22)))
    for url in (f"file://{outside}", f"file://{media_dir}/../{outside.parent.name}/outside.png"):
        with pytest.raises(openai.BadRequestError, match="outside --allowed-local-media-path"):
            _chat(client, _messages(url))


def test_http_urls_fetched_within_the_limits(client, llava_dir, media_server):
    response = _chat(client, _messages(f"{media_server}/image.png"))
    _assert_equals_transformers(llava_dir, response, [random_image(21)])
    with pytest.raises(openai.BadRequestError, match="redirects are not followed"):
        _chat(client, _messages(f"{media_server}/redirect"))
    with pytest.raises(openai.BadRequestError, match="VLLM_IMAGE_FETCH_TIMEOUT"):
        _chat(client, _messages(f"{media_server}/slow.png"))
    other_host = media_server.replace("127.0.0.1", "localhost")
    with pytest.raises(openai.BadRequestError, match="not one of --allowed-media-domains"):
        _chat(client, _messages(f"{other_host}/image.png"))


def test_limit_mm_per_prompt(client):
    url = _data_url(_encoded(random_image(25)))
    with pytest.raises(openai.BadRequestError, match=r"At most 2 image\(s\)"):
        _chat(client, _messages(url, url, url))


def test_processor_kwargs_of_the_request_need_trust(client, llava_dir, untrusting_client):
    image = random_image(26)
    with pytest.raises(openai.BadRequestError, match="--trust-request-mm-kwargs") as error:
        _chat(
            untrusting_client,
            _messages(_data_url(_encoded(image))),
            mm_processor_kwargs={"do_normalize": False},
        )
    assert error.value.body["param"] == "mm_processor_kwargs"
    response = _chat(
        client, _messages(_data_url(_encoded(image))), mm_processor_kwargs={"do_normalize": False}
    )
    _assert_equals_transformers(llava_dir, response, [image], do_normalize=False)


def _respond(client, url: str, **extra):
    """A Responses API call whose message holds text and an ``input_image``."""
    content = [{"type": "input_text", "text": "Look:"}, {"type": "input_image", "image_url": url}]
    return client.responses.create(
        model="llava",
        input=[{"role": "user", "content": content}],
        max_output_tokens=4,
        temperature=0.0,
        **extra,
    )


def test_responses_input_image(client):
    response = _respond(client, _data_url(_encoded(random_image(27))))
    assert response.usage.input_tokens > 16  # the image's 16 feature tokens and the text
    assert response.usage.output_tokens == 4


def test_streamed_chat_and_responses_with_images(client):
    url = _data_url(_encoded(random_image(32)))
    whole = _chat(client, _messages(url)).choices[0].message.content
    chunks = client.chat.completions.create(
        model="llava",
        messages=_messages(url),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    events = _respond(client, url, stream=True)
    last = list(events)[-1]
    assert last.response.usage.input_tokens > 16


def _bomb() -> bytes:
    """A PNG of 100 million one-bit pixels: a few kilobytes that would decode to 12.5 MB (and
    to 300 MB as the RGB the processor wants)."""
    return _encoded(Image.new("1", (10_000, 10_000)))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (lambda: _data_url(_encoded(random_image(28))[:200]), "truncated or corrupt"),
        (lambda: _data_url(b"\x89PNG not really an image"), "not an image this server can read"),
        (lambda: _data_url(_bomb()), r"more than \d+ pixels, the most this server decodes"),
        (lambda: _data_url(_encoded(random_image(29), "JPEG")), "declared image/png but the data"),
        (lambda: _data_url(b"text", "text/plain"), "'text/plain' is not an image type"),
        (lambda: "data:image/png;base64,***", "not valid base64"),
        (lambda: "ftp://example.com/a.png", r"must be a data:, file:// or http\(s\):// URL"),
        (lambda: "file:///etc/passwd", "outside --allowed-local-media-path"),
    ],
)
def test_hostile_media_is_a_400_naming_the_part(client, vision_server, url, message):
    with pytest.raises(openai.BadRequestError, match=message) as error:
        _chat(client, _messages(url()))
    assert error.value.body["param"] == PART
    assert httpx.get(f"{vision_server.url}/health").status_code == 200
    response = _chat(client, _messages(_data_url(_encoded(random_image(30)))))
    assert response.usage.completion_tokens == MAX_TOKENS


def test_a_text_model_refuses_image_parts(main_server):
    client = openai.OpenAI(
        base_url=f"{main_server.url}/v1", api_key=main_server.api_key, max_retries=0
    )
    with pytest.raises(openai.BadRequestError, match="this model takes text only") as error:
        client.chat.completions.create(
            model="tiny", messages=_messages(_data_url(_encoded(random_image(31)))), max_tokens=2
        )
    assert error.value.body["param"] == PART


def test_tokenize_expands_each_image(client, vision_server, llava_dir):
    messages = _messages(_data_url(_encoded(random_image(33))))
    served = _chat(client, messages)
    body = {"model": "llava", "messages": messages, "add_generation_prompt": True}
    tokens = httpx.post(f"{vision_server.url}/tokenize", json=body).json()
    assert tokens["count"] == served.usage.prompt_tokens
    image_id = hf_processor(str(llava_dir)).tokenizer.convert_tokens_to_ids("<image>")
    assert tokens["tokens"].count(image_id) == 16  # the image's feature tokens


def _mm_cache_counts(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values["vllm:mm_cache_queries_total"], values["vllm:mm_cache_hits_total"]


def test_a_repeated_image_hits_the_processor_cache(client, vision_server, llava_dir):
    image = random_image(34)
    # lookups of requests refused after the processor ran reach the metrics with the next step
    _chat(client, [{"role": "user", "content": "Hello"}])
    queries, hits = _mm_cache_counts(vision_server.url)
    first = _chat(client, _messages(_data_url(_encoded(image))))
    again = _chat(client, _messages(_data_url(_encoded(image))))
    _assert_equals_transformers(llava_dir, again, [image])
    assert again.choices[0].message.content == first.choices[0].message.content
    # the counts reach the metrics with the engine step after the request was prepared
    for _ in range(100):
        counts = _mm_cache_counts(vision_server.url)
        if counts == (queries + 2, hits + 1):
            break
        time.sleep(0.1)
    assert counts == (queries + 2, hits + 1)


def test_health_answers_while_a_large_image_is_processed(client, vision_server):
    # 6000 x 6000 pixels: seconds of decoding, hashing and resizing on the API side (a loop
    # that did it would leave /health unanswered for as long)
    image = Image.linear_gradient("L").resize((6000, 6000)).convert("RGB")
    url = _data_url(_encoded(image))
    done = threading.Event()
    polls_during = 0

    def chat():
        try:
            return _chat(client, _messages(url))
        finally:
            done.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat)
        with httpx.Client(base_url=vision_server.url, timeout=1.0) as http:
            while not done.is_set():
                # a loop blocked by the image would leave this unanswered past the 1 s timeout
                assert http.get("/health").status_code == 200
                polls_during += not done.is_set()
        assert answer.result().choices[0].message.content is not None
    assert polls_during > 0
