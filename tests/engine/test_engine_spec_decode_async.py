"""Speculative decoding under ``--async-scheduling``: a request's next step is scheduled while its
last one runs, with draft slots (``DRAFT_PLACEHOLDER``) the worker fills with the drafts that
step guesses, as if every draft in flight were kept; the worker computes from where its kept
tokens end. For every method, greedy tokens equal the engine's without speculation (under
chunked prefill, prefix-cache hits and preemption), steps really were planned ahead, and the
counters count only the drafts verified."""

from __future__ import annotations

import pytest
from infernetes.runtime.engine.scheduler_output import DRAFT_PLACEHOLDER, CachedRequestData
from infernetes.runtime.testing import make_tiny_deepseek_mtp, make_tiny_eagle, make_tiny_eagle3

from infernetes import LLM, SamplingParams

from .test_engine_spec_decode_ngram import GREEDY, NGRAM, PROMPTS, SMALL, generate

CHUNKED = {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}
SMALL_CACHE = {"num_gpu_blocks_override": 16}  # too few blocks for the three prompts at once


@pytest.fixture(scope="module")
def targets(tiny_llama, model_factory, tmp_path_factory):
    """Each method's (target, --speculative-config)."""
    deeper = model_factory("LlamaForCausalLM", num_hidden_layers=4)  # EAGLE-3 reads 3 layers
    deepseek = model_factory("DeepseekV3ForCausalLM")
    folder = tmp_path_factory.mktemp("async-heads")
    return {
        "ngram": (tiny_llama, NGRAM),
        "draft_model": (
            tiny_llama,
            {"method": "draft_model", "model": tiny_llama, "num_speculative_tokens": 3},
        ),
        "eagle": (
            tiny_llama,
            {
                "method": "eagle",
                "model": str(make_tiny_eagle(folder / "eagle", tiny_llama)),
                "num_speculative_tokens": 3,
            },
        ),
        "eagle3": (
            deeper,
            {
                "method": "eagle3",
                "model": str(make_tiny_eagle3(folder / "eagle3", deeper)),
                "num_speculative_tokens": 3,
            },
        ),
        "mtp": (
            str(make_tiny_deepseek_mtp(folder / "mtp", deepseek)),
            {"method": "mtp", "num_speculative_tokens": 2},
        ),
    }


_plain: dict[str, dict] = {}


def plain_tokens(target: str) -> dict:
    """The target's greedy tokens, synchronous and without speculation (once per target)."""
    if target not in _plain:
        _plain[target], _, _ = generate(LLM(target, **SMALL), PROMPTS, GREEDY)
    return _plain[target]


def planned_ahead(llm: LLM) -> list[int]:
    """Records, for each step scheduled from now on, its draft slots left as placeholders."""
    scheduler = llm.llm_engine.engine_core.scheduler
    schedule = scheduler.schedule
    slots: list[int] = []

    def recorded():
        output = schedule()
        slots.append(
            sum(
                data.spec_token_ids.count(DRAFT_PLACEHOLDER)
                for data in output.scheduled_reqs
                if isinstance(data, CachedRequestData)
            )
        )
        return output

    scheduler.schedule = recorded
    return slots


def preemptions(llm: LLM) -> list[str]:
    scheduler = llm.llm_engine.engine_core.scheduler
    preempt = scheduler._preempt
    preempted: list[str] = []

    def counted(request):
        preempted.append(request.request_id)
        return preempt(request)

    scheduler._preempt = counted
    return preempted


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle", "eagle3", "mtp"])
@pytest.mark.parametrize(
    "settings", [{}, CHUNKED, SMALL_CACHE], ids=["whole", "chunked", "preempted"]
)
def test_greedy_tokens_equal_those_without(targets, method, settings):
    target, spec = targets[method]
    llm = LLM(target, speculative_config=spec, async_scheduling=True, **{**SMALL, **settings})
    slots = planned_ahead(llm)
    preempted = preemptions(llm)
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == plain_tokens(target)
    assert drafts > 0 and 0 <= accepted <= draft_tokens
    assert sum(slots) > 0  # steps were scheduled before the drafts they verify were guessed
    assert bool(preempted) == (settings is SMALL_CACHE)


def test_a_draft_equal_to_the_target_accepts_every_draft(targets):
    """Draft slots the worker leaves empty (a request near its end) are not counted as drafts:
    every draft counted is accepted, at every position."""
    target, spec = targets["draft_model"]
    llm = LLM(target, speculative_config=spec, async_scheduling=True, **SMALL)
    slots = planned_ahead(llm)
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == plain_tokens(target)
    assert sum(slots) > 0 and drafts > 0 and accepted == draft_tokens
    # the ngram module's generate checks each step's per-position counts; here all were kept
    short = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, short)
    assert all(len(t) == 7 for t in tokens.values())
    assert drafts > 0 and accepted == draft_tokens


def test_prefix_cache_hits(targets, hf_greedy):
    """A prompt that continues an earlier one reads its blocks from the prefix cache: blocks
    registered while steps ran ahead hold only kept tokens' keys and values."""
    target, spec = targets["ngram"]
    llm = LLM(target, speculative_config=spec, async_scheduling=True, **SMALL)
    fresh = [f"again: {prompt}" for prompt in PROMPTS]
    drafted, (drafts, _, _), _ = generate(llm, fresh, GREEDY)
    assert drafts > 0
    longer = [list(prompt) + tokens[:20] for prompt, tokens in drafted.items()]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tokens, (drafts, _, _), cached = generate(
        llm, [{"prompt_token_ids": ids} for ids in longer], params
    )
    assert cached >= sum(len(ids) - 15 for ids in longer)
    assert drafts > 0
    for ids in longer:
        assert tokens[tuple(ids)] == hf_greedy(target, ids, 12)


def test_stops_inside_a_step_planned_ahead(targets):
    """A request that stops on a token of a step whose successor is already scheduled ends
    there; the successor's tokens are dropped."""
    target, spec = targets["draft_model"]
    expected = plain_tokens(target)
    first_prompt, first = next(iter(expected.items()))
    stop = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[first[9]])
    sync = LLM(target, **SMALL).generate([{"prompt_token_ids": list(first_prompt)}], stop)
    llm = LLM(target, speculative_config=spec, async_scheduling=True, **SMALL)
    got = llm.generate([{"prompt_token_ids": list(first_prompt)}], stop)
    assert got[0].outputs[0].token_ids == sync[0].outputs[0].token_ids
    assert got[0].outputs[0].finish_reason == "stop"
