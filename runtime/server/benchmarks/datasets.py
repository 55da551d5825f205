"""Benchmark prompts: ``random`` (token ids of chosen lengths, reproducible by seed) or
``sharegpt`` (a ShareGPT-format JSON file: conversations whose first human turn is the prompt
and whose first reply sets the output length)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchRequest:
    prompt: str | list[int]
    prompt_len: int
    output_len: int


def random_requests(
    num: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    vocab_size: int,
    seed: int,
    special_ids: set[int] | None = None,
) -> list[BenchRequest]:
    """Prompts of random token ids; lengths uniform in ``len * [1 - ratio, 1 + ratio]``."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    allowed = [t for t in range(vocab_size) if t not in (special_ids or set())]

    def length(center: int) -> int:
        low = max(1, int(center * (1 - range_ratio)))
        return rng.randint(low, max(low, int(center * (1 + range_ratio))))

    requests = []
    for _ in range(num):
        n_in = length(input_len)
        requests.append(
            BenchRequest([rng.choice(allowed) for _ in range(n_in)], n_in, length(output_len))
        )
    return requests


def sharegpt_requests(
    path: str,
    num: int,
    tokenizer: Any,
    seed: int,
    output_len: int | None = None,
    max_len: int | None = None,
) -> list[BenchRequest]:
    with open(path) as handle:
        conversations = json.load(handle)
    rng = random.Random(seed)
    rng.shuffle(conversations)
    requests = []
    for entry in conversations:
        turns = entry.get("conversations") or entry.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt, reply = turns[0].get("value", ""), turns[1].get("value", "")
        prompt_len = len(tokenizer.encode(prompt))
        n_out = output_len or len(tokenizer.encode(reply, add_special_tokens=False))
        if prompt_len < 4 or n_out < 4 or (max_len and prompt_len + n_out > max_len):
            continue
        requests.append(BenchRequest(prompt, prompt_len, n_out))
        if len(requests) == num:
            break
    if not requests:
        raise ValueError(f"{path}: no usable ShareGPT conversations (need 'conversations' lists)")
    return requests
