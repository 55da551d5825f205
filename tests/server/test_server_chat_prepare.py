"""A chat request is checked once: the adapter its model name selects comes from ``_prepare``
(before, ``create`` looked the model up a second time)."""

from __future__ import annotations

import asyncio

import pytest
from infernetes.runtime.server.chat_template import ChatRenderer
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.protocol import ChatCompletionRequest
from infernetes.runtime.server.serving_chat import ChatServing
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.testing import build_tokenizer


class RefusingEngine:
    """Takes the request's arguments, then refuses it (the answer does not matter here)."""

    max_model_len = 64

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.params = None

    async def generate(self, prompt, params, request_id, *, priority=0, lora_request=None):
        self.params = params
        raise ValueError("refused")
        yield  # an async generator, as the engine's


def test_chat_checks_the_model_once(tmp_path, monkeypatch):
    tokenizer = build_tokenizer(tmp_path)
    engine = RefusingEngine(tokenizer)
    serving = ChatServing(engine, FrontendSettings(), ChatRenderer(tokenizer, None, "auto"), None)
    checked = []
    monkeypatch.setattr(ChatServing, "check_model", lambda self, name: checked.append(name))
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_object"},
    )
    with pytest.raises(APIError, match="refused"):
        asyncio.run(serving.create(request))
    assert checked == ["tiny"]
    # the constraint goes to the engine as asked, compiled there
    assert engine.params.structured_outputs.kind == "json_object"
    assert engine.params.logits_processors is None
