"""The sampler is total: whatever the logits (NaN, infinities, the dtype's extremes) and whatever
the sampling parameters SamplingParams accepts, every token it returns is in the vocabulary.
A token id past the vocabulary used to kill the engine on the next step."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from infernetes.runtime.model_executor.sampler import Sampler
from infernetes.runtime.worker.request_state import CachedRequestState

from infernetes import SamplingParams

VOCAB = 40
F32 = torch.finfo(torch.float32)
EXTREMES = [math.nan, math.inf, -math.inf, F32.max, F32.min, 1e30, -1e30, 0.0, 1e-45]

DEVICES = [
    pytest.param("cpu"),
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]

logit_values = st.one_of(st.sampled_from(EXTREMES), st.floats(-50, 50, width=32))
rows = st.lists(logit_values, min_size=VOCAB, max_size=VOCAB)
# Values SamplingParams accepts (the API narrows them further; this is the second line).
params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 1e-5, 2e-5, 0.3, 1.0, 100.0, 1e30, 1e300]),
    top_p=st.sampled_from([1e-300, 1e-6, 0.5, 0.95, 1.0]),
    top_k=st.sampled_from([0, 1, 3, VOCAB - 1, VOCAB, 10**6]),
    min_p=st.sampled_from([0.0, 1e-30, 0.5, 1.0]),
    repetition_penalty=st.sampled_from([5e-324, 1e-300, 1e-30, 1.0, 1e30, 1e300]),
    frequency_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    presence_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    logit_bias=st.one_of(
        st.none(),
        st.dictionaries(
            st.integers(0, VOCAB - 1),
            st.sampled_from([math.inf, -math.inf, 1e308, -1e308, -100.0, 100.0]),
            max_size=VOCAB,
        ),
    ),
    allowed_token_ids=st.one_of(
        st.none(), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)
    ),
    min_tokens=st.sampled_from([0, 5]),
    seed=st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)),
    logprobs=st.sampled_from([None, 0, 3]),
)


def _request(i: int, sampling: SamplingParams) -> CachedRequestState:
    # prompt 1, 2, 3; output tokens 4, 4, 5 for the penalties to weigh
    generator = None if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
    return CachedRequestState(f"r{i}", [1, 2, 3, 4, 4, 5], 3, sampling, 0, -1, 0, generator)


# Penalties and logprobs row by row (a CPU's way) and for all rows at once (a GPU's).
BATCHED = [pytest.param(False, id="row-by-row"), pytest.param(True, id="batched")]


@pytest.mark.parametrize("batched", BATCHED)
@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(rows, params), min_size=1, max_size=6))
def test_every_token_is_in_the_vocabulary(device, batched, batch):
    logits = torch.tensor([row for row, _ in batch], dtype=torch.float32, device=device)
    requests = [_request(i, p) for i, (_, p) in enumerate(batch)]
    for sampled in Sampler(0, batched=batched)(logits, requests):
        assert 0 <= sampled.token_id < VOCAB


@pytest.mark.parametrize("batched", BATCHED)
@pytest.mark.parametrize("device", DEVICES)
def test_nan_is_never_chosen_and_infinity_takes_the_row(device, batched):
    """Sampled rows, and greedy rows with a bias or penalty, read NaN as -inf; +inf tokens share
    their row. (A greedy row straight from the model takes its argmax as it is: in the vocabulary.)"""
    nan, inf = math.nan, math.inf
    logits = torch.tensor(
        [[nan, 1.0, nan, 0.5], [0.0, inf, 3.0, inf], [nan] * 4, [-inf] * 4], device=device
    )
    for sampling in (
        dict(temperature=1.0),
        dict(temperature=0.0, logit_bias={3: -0.25}),
        dict(temperature=0.5, repetition_penalty=2.0),
    ):
        requests = [_request(i, SamplingParams(seed=i, **sampling)) for i in range(4)]
        for _ in range(20):
            sampled = Sampler(batched=batched)(logits, requests)
            first, second, *others = [s.token_id for s in sampled]
            assert first in (1, 3), sampling
            assert second in (1, 3), sampling
            assert all(0 <= token < 4 for token in others)


@pytest.mark.parametrize("batched", BATCHED)
def test_extreme_bias_and_penalty_stay_in_the_vocabulary(batched):
    """The request shapes that killed the server: a bias of NaN, inf or 1e308 on a token or on
    every token, and a repetition penalty of 5e-324."""
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    cases = [
        dict(logit_bias={3: math.inf}),
        dict(logit_bias={3: 1e308}),
        dict(logit_bias=dict.fromkeys(range(VOCAB), -1e308)),
        dict(repetition_penalty=5e-324),
        dict(repetition_penalty=1e-300),
    ]
    for case in cases:
        for temperature in (0.0, 0.7):
            request = _request(0, SamplingParams(temperature=temperature, **case))
            token = Sampler(0, batched=batched)(logits, [request])[0].token_id
            assert 0 <= token < VOCAB, case
            if "logit_bias" in case and len(case["logit_bias"]) == 1:
                assert token == 3, case  # the biased token dominates


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_sampling_params_refuse_meaningless_numbers(value):
    for field in (
        "temperature",
        "repetition_penalty",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
    ):
        if field == "temperature" and value == -math.inf:
            continue
        with pytest.raises(ValueError, match=field):
            SamplingParams(**{field: value})
    if math.isnan(value):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams(logit_bias={1: value})
