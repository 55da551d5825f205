"""The scheduler's encoder budget per step (vLLM's ``max_num_encoder_input_tokens`` and encoder
cache size, ``max_num_batched_tokens`` by default), on Qwen2-VL with images on the CPU: a batch
of image requests whose images' encoder tokens exceed one step's budget gives the outputs of an
unconstrained run while no step encodes more than the budget; an image larger than the whole
budget is encoded alone; ``EncoderBudget`` cuts a chunk before the item that does not fit."""

from __future__ import annotations

import dataclasses

import pytest
from infernetes.runtime.engine.encoder_budget import EncoderBudget
from infernetes.runtime.engine.request import Request
from infernetes.runtime.multimodal.inputs import MultiModalFeature
from infernetes.runtime.testing_vision import QWEN_IMAGE, make_tiny_qwen2_vl, random_image

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
# 40 x 36 pixels: a 3 x 3 grid of merged patches, 9 tokens each (make_tiny_qwen2_vl's patches)
SIZES = [(40, 36), (40, 36), (70, 50), (40, 36), (30, 90)]


def _request(features: list[tuple[int, int, str]]) -> Request:
    items = [MultiModalFeature("image", o, n, ident, {}) for o, n, ident in features]
    return Request("r", list(range(100)), None, mm_features=items)


def test_a_chunk_stops_before_the_item_that_does_not_fit():
    budget = EncoderBudget(20, 100, [])
    request = _request([(10, 12, "a"), (30, 12, "b")])
    assert budget.fit(request, 0, 50) == 30  # a fits (12 of 20), b would make 24
    budget.charge(request, 0, 30)
    assert budget.num_tokens == 12
    assert request.encoder_held == {}  # a ends at 22, before the chunk's end: released
    # another request in the same step: its item of 12 does not fit the 8 left
    other = _request([(5, 12, "c")])
    assert budget.fit(other, 0, 40) == 5
    # next step: a chunk starting inside an item the workers hold encodes nothing new
    step = EncoderBudget(20, 100, [])
    split = _request([(10, 12, "a")])
    step.charge(split, 0, 15)
    assert split.encoder_held == {"a": 12}
    after = EncoderBudget(20, 100, [split])
    assert after.cache_free == 88
    assert after.fit(split, 15, 30) == 30


def test_an_item_larger_than_the_budget_is_encoded_alone():
    request = _request([(4, 30, "big"), (40, 5, "small")])
    budget = EncoderBudget(20, 20, [])
    assert budget.fit(request, 0, 60) == 40  # alone: the small one waits for the next step
    budget.charge(request, 0, 40)
    assert budget.fit(_request([(0, 1, "x")]), 0, 10) == 0  # nothing more this step


def test_items_whose_outputs_fill_the_cache_wait_but_the_first_of_a_step():
    holder = _request([(0, 50, "held")])
    holder.encoder_held = {"held": 50}
    budget = EncoderBudget(100, 60, [holder])
    first = _request([(0, 5, "first")])
    assert budget.fit(first, 0, 10) == 10  # 50 held + 5: fits
    budget.charge(first, 0, 4)
    assert budget.fit(_request([(3, 20, "new")]), 0, 30) == 3  # 55 held + 20 > 60
    # a request holding a repeated image (its later use ahead) still encodes the one between
    repeated = _request([(0, 12, "x"), (20, 4, "y"), (40, 12, "x")])
    repeated.encoder_held = {"x": 12}
    step = EncoderBudget(8, 8, [repeated])
    assert step.fit(repeated, 12, 20) == 20


def _prompts() -> list[dict]:
    return [
        {
            "prompt": f"Look {i}: {QWEN_IMAGE} and say",
            "multi_modal_data": {"image": random_image(70 + i, size)},
        }
        for i, size in enumerate(SIZES)
    ]


def _run(qwen_dir: str, encoder_tokens: int) -> tuple[list, list[int]]:
    """Outputs, and each step's encoder tokens, with ``encoder_tokens`` (0: the default)."""
    llm = LLM(qwen_dir, dtype="float32", max_model_len=256, block_size=8)
    scheduler = llm.llm_engine.engine_core.scheduler
    scheduler.config = dataclasses.replace(
        scheduler.config, max_num_encoder_input_tokens=encoder_tokens
    )
    schedule = scheduler.schedule
    per_step: list[int] = []

    def recording():
        output = schedule()
        per_step.append(output.num_encoder_tokens)
        return output

    scheduler.schedule = recording
    outputs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs], per_step


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return str(make_tiny_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl")))


def _chosen(logprobs: list, tokens: list[int]) -> list[float]:
    return [entry[token].logprob for entry, token in zip(logprobs, tokens, strict=True)]


@pytest.fixture(scope="module")
def unconstrained(qwen_dir):
    return _run(qwen_dir, 0)


def _assert_same_outputs(outputs: list, expected: list) -> None:
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(outputs, expected, strict=True):
        assert tokens == want_tokens
        assert _chosen(logprobs, tokens) == pytest.approx(_chosen(want_logprobs, tokens), abs=1e-4)


def test_a_batch_over_the_encoder_budget_equals_an_unconstrained_run(qwen_dir, unconstrained):
    expected, free_steps = unconstrained
    budget = 20  # two of the small images (9 tokens each) a step at most
    assert max(free_steps) > budget  # unconstrained, one step encodes more
    outputs, steps = _run(qwen_dir, budget)
    assert max(steps) <= budget
    assert sum(steps) == sum(free_steps)  # every image encoded once either way
    assert len([n for n in steps if n]) > len([n for n in free_steps if n])
    _assert_same_outputs(outputs, expected)


def test_images_larger_than_the_budget_are_encoded_one_a_step(qwen_dir, unconstrained):
    expected, free_steps = unconstrained
    outputs, steps = _run(qwen_dir, 4)  # below every image's tokens
    assert len([n for n in steps if n]) == len(SIZES)
    assert sum(steps) == sum(free_steps)
    _assert_same_outputs(outputs, expected)
