"""The GPU smoke files' harness (test_engine_gpu_matches_cpu.py, test_engine_gpu_multimodal.py):
one tiny model's greedy tokens on the CPU, the reference (the CPU tests hold them equal to
transformers'), against the same model's on CUDA. ``devices=("cpu", "cpu")`` dry-runs a file's
cases on a machine without a GPU."""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from infernetes import LLM, SamplingParams


def greedy_token_ids(
    path: str,
    prompts: Sequence[Any],
    sampling: SamplingParams,
    engine: Mapping[str, Any],
    device: str,
) -> list[list[int]]:
    """Each prompt's tokens from a fresh engine on `device`, freed before the next one loads."""
    llm = LLM(path, device=device, **engine)
    tokens = [list(out.outputs[0].token_ids) for out in llm.generate(list(prompts), sampling)]
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return tokens


def assert_same_greedy_tokens(
    path: str,
    prompts: Sequence[Any],
    sampling: SamplingParams,
    engine: Mapping[str, Any],
    devices: tuple[str, str] = ("cpu", "cuda"),
) -> None:
    """The second device generates the first's tokens for every prompt."""
    reference, device = devices
    want = greedy_token_ids(path, prompts, sampling, engine, reference)
    got = greedy_token_ids(path, prompts, sampling, engine, device)
    for index, (prompt, expected, actual) in enumerate(zip(prompts, want, got, strict=True)):
        # a text prompt names itself; a multimodal one by its place (its repr holds the media)
        assert actual == expected, prompt if isinstance(prompt, str) else f"prompt {index}"
