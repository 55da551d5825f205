"""``infernetes chat`` and ``infernetes complete``: talk to a running server with the official
openai client, one quick message (``-q``) or an interactive loop that streams each reply."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

import openai
from openai.types.chat import ChatCompletionMessageParam


def connect(url: str, api_key: str | None, model_name: str | None) -> tuple[openai.OpenAI, str]:
    """A client for ``url`` and the model to use: ``model_name`` or the server's first model."""
    client = openai.OpenAI(base_url=url, api_key=api_key or "EMPTY")
    if model_name:
        return client, model_name
    models = client.models.list().data
    if not models:
        raise RuntimeError(f"the server at {url} serves no model")
    return client, models[0].id


def _lines(prompt: str, read: Callable[[str], str]) -> Any:
    while True:
        try:
            line = read(prompt)
        except (EOFError, KeyboardInterrupt):
            return
        yield line


def chat(
    client: openai.OpenAI,
    model: str,
    system_prompt: str | None,
    quick: str | None,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> None:
    messages: list[ChatCompletionMessageParam] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    inputs = [quick] if quick is not None else _lines("> ", read)
    for text in inputs:
        messages.append({"role": "user", "content": text})
        reply = ""
        for chunk in client.chat.completions.create(model=model, messages=messages, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                piece = chunk.choices[0].delta.content
                reply += piece
                out.write(piece)
                out.flush()
        out.write("\n")
        messages.append({"role": "assistant", "content": reply})


def complete(
    client: openai.OpenAI,
    model: str,
    quick: str | None,
    max_tokens: int | None = None,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> None:
    inputs = [quick] if quick is not None else _lines("> ", read)
    for prompt in inputs:
        for chunk in client.completions.create(
            model=model, prompt=prompt, stream=True, max_tokens=max_tokens
        ):
            if chunk.choices and chunk.choices[0].text:
                out.write(chunk.choices[0].text)
                out.flush()
        out.write("\n")
