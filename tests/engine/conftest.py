"""Fixtures for the engine tests: tiny models written once per session, HF reference outputs."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def sharp_llama(model_factory):
    """A random Llama whose next-token distributions are peaked (larger weights): at temperature
    1 its likely tokens carry a good share of the mass, as a trained model's do."""
    return model_factory("LlamaForCausalLM", initializer_range=0.6)


@pytest.fixture(scope="session")
def hf_greedy():
    """Transformers' greedy continuation, the reference (``runtime.testing.hf_greedy_tokens``)."""
    from infernetes.runtime.testing import hf_greedy_tokens

    return hf_greedy_tokens
