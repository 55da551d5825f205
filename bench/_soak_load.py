"""The soak benchmark's load: a steady mix of OpenAI requests from a fixed number of workers.

Each call is drawn from ``SHAPES``: completions and chat, streamed or not, greedy and sampled
(seeds, penalties, top-k/top-p/min-p), logprobs and prompt logprobs, stop strings, ``n`` > 1,
structured output, token-id prompts, streams the client cuts after a few events, and prompts
over the context length (a 400). Between them they reach every per-request structure the server
and the engine keep.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from infernetes.runtime.server.sse_reader import asse_lines

WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "cache",
    "keys",
    "values",
    "tokens",
    "batch",
    "pods",
    "nodes",
    "server",
    "request",
    "model",
    "engine",
    "paged",
    "blocks",
    "attention",
    "sea",
    "shells",
    "journey",
    "miles",
    "step",
    "hello",
    "world",
    "numbers",
    "café",
    "naïve",
    "日本語",
    "🙂",
)


@dataclass(frozen=True)
class Call:
    kind: str  # the label counted in the report
    path: str
    body: dict[str, Any]
    cut_after: int | None = None  # a streamed call closed after this many events


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _messages(rng: random.Random) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": _text(rng, 2, 8)},
        {"role": "user", "content": _text(rng, 4, 40)},
    ]


def _sampled(rng: random.Random) -> dict[str, Any]:
    return {
        "temperature": rng.choice([0.7, 1.0, 1.3]),
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.02,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.3,
        "repetition_penalty": 1.1,
        "seed": rng.randrange(1 << 31),
    }


SHAPES: dict[str, Callable[[random.Random], Call]] = {
    "completion": lambda rng: Call(
        "completion",
        "/v1/completions",
        {"prompt": _text(rng, 4, 60), "max_tokens": rng.randint(4, 32), "temperature": 0},
    ),
    "completion-stream-sampled": lambda rng: Call(
        "completion-stream-sampled",
        "/v1/completions",
        {
            "prompt": _text(rng, 4, 60),
            "max_tokens": rng.randint(8, 48),
            "stream": True,
            **_sampled(rng),
        },
    ),
    "completion-n3-logprobs-stop": lambda rng: Call(
        "completion-n3-logprobs-stop",
        "/v1/completions",
        {
            "prompt": _text(rng, 4, 40),
            "max_tokens": 24,
            "n": 3,
            "logprobs": 3,
            "temperature": 1.0,
            "seed": rng.randrange(1 << 31),
            "stop": [" the", "."],
        },
    ),
    "completion-prompt-logprobs": lambda rng: Call(
        "completion-prompt-logprobs",
        "/v1/completions",
        {"prompt": _text(rng, 4, 40), "max_tokens": 4, "prompt_logprobs": 2, "echo": True},
    ),
    "completion-token-ids": lambda rng: Call(
        "completion-token-ids",
        "/v1/completions",
        {
            "prompt": [rng.randrange(5, 500) for _ in range(rng.randint(4, 80))],
            "max_tokens": 16,
            "ignore_eos": True,
        },
    ),
    "chat": lambda rng: Call(
        "chat",
        "/v1/chat/completions",
        {"messages": _messages(rng), "max_tokens": rng.randint(4, 32)},
    ),
    "chat-stream-n2-logprobs": lambda rng: Call(
        "chat-stream-n2-logprobs",
        "/v1/chat/completions",
        {
            "messages": _messages(rng),
            "max_tokens": 24,
            "stream": True,
            "n": 2,
            "logprobs": True,
            "top_logprobs": 2,
            "stream_options": {"include_usage": True},
            **_sampled(rng),
        },
    ),
    "chat-stop-strings": lambda rng: Call(
        "chat-stop-strings",
        "/v1/chat/completions",
        {
            "messages": _messages(rng),
            "max_tokens": 32,
            "stop": ["a", " s"],
            "include_stop_str_in_output": rng.random() < 0.5,
        },
    ),
    "chat-guided-choice": lambda rng: Call(
        "chat-guided-choice",
        "/v1/chat/completions",
        {"messages": _messages(rng), "max_tokens": 8, "guided_choice": ["yes", "no", "maybe"]},
    ),
    "chat-stream-cut": lambda rng: Call(
        "chat-stream-cut",
        "/v1/chat/completions",
        {"messages": _messages(rng), "max_tokens": 64, "ignore_eos": True, "stream": True},
        cut_after=rng.randint(1, 4),
    ),
    "completion-too-long": lambda rng: Call(
        "completion-too-long", "/v1/completions", {"prompt": _text(rng, 700, 900), "max_tokens": 4}
    ),
}


async def send(client: httpx.AsyncClient, call: Call) -> str:
    """Make one call; the outcome as a label: the status code, ``cut`` or the error's name."""
    try:
        if not call.body.get("stream"):
            response = await client.post(call.path, json=call.body)
            return str(response.status_code)
        async with client.stream("POST", call.path, json=call.body) as response:
            if response.status_code != 200:
                await response.aread()
                return str(response.status_code)
            events = 0
            async for line in asse_lines(response.aiter_text()):
                if line.startswith("data: {"):
                    events += 1
                    if '"error"' in line and "error" in json.loads(line[6:]):
                        return "error-event"
                    if call.cut_after is not None and events >= call.cut_after:
                        return "cut"  # leaving the block closes the connection mid-stream
            return "200"
    except httpx.HTTPError as error:
        return type(error).__name__


async def drive(
    base_url: str, model: str, seconds: float, concurrency: int, seed: int, outcomes: Counter
) -> None:
    """``concurrency`` workers send calls for ``seconds``; ``outcomes[(kind, outcome)]`` counts
    them as they finish (read it while this runs for progress)."""
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:

        async def worker(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            shapes = list(SHAPES.values())
            while time.monotonic() < deadline:
                call = rng.choice(shapes)(rng)
                call.body["model"] = model
                outcomes[(call.kind, await send(client, call))] += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))


def large_prompt_body(model: str, megabytes: float) -> dict[str, Any]:
    """A completions body whose prompt is ``megabytes`` of words (far over any context length)."""
    rng = random.Random(0)
    words = [rng.choice(WORDS) for _ in range(4096)]
    chunk = " ".join(words) + " "
    repeats = int(megabytes * 1e6) // len(chunk.encode()) + 1
    return {"model": model, "prompt": chunk * repeats, "max_tokens": 1}
