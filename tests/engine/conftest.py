"""Fixtures for the engine tests: tiny models written once per session, HF reference outputs."""

from __future__ import annotations

import functools
import json

import pytest
import torch

torch.set_num_threads(1)  # the machine's two cores are shared with other test runs


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    """``model_factory(architecture, **config_overrides) -> path``, one folder per arguments."""
    from infernetes.runtime.testing import make_tiny_model

    made: dict[str, str] = {}

    def factory(architecture: str = "LlamaForCausalLM", **overrides):
        key = json.dumps([architecture, overrides], sort_keys=True)
        if key not in made:
            directory = tmp_path_factory.mktemp(architecture)
            made[key] = str(make_tiny_model(directory, architecture, **overrides))
        return made[key]

    return factory


@pytest.fixture(scope="session")
def tiny_llama(model_factory):
    return model_factory("LlamaForCausalLM")


@functools.cache
def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_greedy():
    return _hf_greedy


def _hf_greedy(path: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Transformers' greedy continuation of ``prompt_ids`` (EOS ignored), the reference."""
    model = _hf_model(path)
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()
