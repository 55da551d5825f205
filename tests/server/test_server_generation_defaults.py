"""The model's generation config on the HTTP routes: ``max_new_tokens`` (from
``generation_config.json`` or ``--override-generation-config``) is a request's default and cap,
as in vLLM; the sampling fields are defaults a request overrides."""

from __future__ import annotations

import asyncio

import pytest
from infernetes.runtime.server.chat_template import ChatRenderer
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from infernetes.runtime.server.serving_chat import ChatServing
from infernetes.runtime.server.serving_completion import CompletionServing
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.testing import build_tokenizer


class RecordingEngine:
    """Keeps a request's sampling parameters, then refuses it (the answer does not matter)."""

    max_model_len = 256

    def __init__(self, tokenizer, defaults) -> None:
        self.tokenizer = tokenizer
        self.default_sampling_params = defaults
        self.params = None

    async def generate(self, prompt, params, request_id, *, priority=0, lora_request=None):
        self.params = params
        raise ValueError("recorded")
        yield  # an async generator, as the engine's


def _chat_params(tmp_path, defaults, **request):
    tokenizer = build_tokenizer(tmp_path)
    engine = RecordingEngine(tokenizer, defaults)
    serving = ChatServing(engine, FrontendSettings(), ChatRenderer(tokenizer, None, "auto"), None)
    body = ChatCompletionRequest(
        model="model", messages=[{"role": "user", "content": "hi"}], **request
    )
    with pytest.raises(APIError, match="recorded"):
        asyncio.run(serving.create(body))
    return engine.params


def test_max_new_tokens_is_the_chat_default(tmp_path):
    assert _chat_params(tmp_path, {"max_tokens": 7}).max_tokens == 7
    # without it, the rest of the context, as before
    assert _chat_params(tmp_path, {}).max_tokens > 100


def test_max_new_tokens_caps_a_larger_request(tmp_path):
    assert _chat_params(tmp_path, {"max_tokens": 7}, max_tokens=50).max_tokens == 7
    assert _chat_params(tmp_path, {"max_tokens": 7}, max_tokens=3).max_tokens == 3


def test_generation_sampling_fields_are_defaults(tmp_path):
    params = _chat_params(tmp_path, {"temperature": 0.3, "top_k": 5})
    assert (params.temperature, params.top_k) == (0.3, 5)
    assert _chat_params(tmp_path, {"temperature": 0.3}, temperature=1.0).temperature == 1.0


def test_max_new_tokens_caps_completions(tmp_path):
    tokenizer = build_tokenizer(tmp_path)
    engine = RecordingEngine(tokenizer, {"max_tokens": 4})
    serving = CompletionServing(engine, FrontendSettings())
    with pytest.raises(APIError, match="recorded"):
        asyncio.run(serving.create(CompletionRequest(model="model", prompt="hi", max_tokens=30)))
    assert engine.params.max_tokens == 4
