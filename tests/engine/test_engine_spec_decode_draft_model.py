"""A draft model (``--speculative-config '{"method": "draft_model", "model": ...}'``): the settings
vLLM allows and the checks against the target, and an engine that emits with a draft the tokens
it emits without one (greedy; under chunked prefill, prefix-cache hits, preemption and LoRA). A
draft identical to the target has every draft accepted; an unrelated random one few."""

from __future__ import annotations

import json

import pytest
from infernetes.runtime.config import SpeculativeConfig
from infernetes.runtime.spec_decode.config import speculative_config
from infernetes.runtime.spec_decode.draft_model import DraftModelProposer
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams

from .test_engine_spec_decode_ngram import PROMPTS, SMALL, generate, runner

K = 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def draft_config(model: str, **extra) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": K, **extra}


@pytest.fixture(scope="module")
def unrelated_draft(model_factory):
    """Another random Llama with the same tokenizer: one layer, half the width."""
    return model_factory(
        "LlamaForCausalLM", seed=1, num_hidden_layers=1, hidden_size=32, intermediate_size=64
    )


@pytest.fixture(scope="module")
def self_drafted(tiny_llama):
    """The target drafting for itself: every greedy draft is the target's own next token."""
    return LLM(tiny_llama, speculative_config=draft_config(tiny_llama), **SMALL)


@pytest.fixture(scope="module")
def plain(tiny_llama):
    """Each prompt's greedy tokens from an engine without drafts (an engine with a draft model
    that stopped proposing would cache blocks without the draft's keys and values)."""
    tokens, counts, _ = generate(LLM(tiny_llama, **SMALL), PROMPTS, GREEDY)
    assert counts == [0, 0, 0]
    return tokens


def per_position_counts(
    llm: LLM, prompts: list, params: SamplingParams, **kwargs
) -> tuple[list[int], list]:
    """Accepted drafts at each position, summed over the steps of one generate call (given
    ``kwargs``), and its outputs."""
    scheduler = llm.llm_engine.engine_core.scheduler
    update = scheduler.update_from_output
    totals = [0] * K

    def counted(scheduler_output, model_output):
        updated, iteration = update(scheduler_output, model_output)
        for position, accepted in enumerate(iteration.num_accepted_tokens_per_pos):
            totals[position] += accepted
        return updated, iteration

    scheduler.update_from_output = counted
    try:
        outputs = llm.generate(prompts, params, **kwargs)
    finally:
        del scheduler.update_from_output
    return totals, outputs


def test_settings_as_vllms():
    given = draft_config("/models/draft", max_model_len=64)
    assert speculative_config(given) == SpeculativeConfig(
        "draft_model", K, draft_model="/models/draft", draft_max_model_len=64
    )
    # a model that is not "ngram" and no method: vLLM's draft_model
    inferred = speculative_config({"model": "/models/draft", "num_speculative_tokens": 2})
    assert inferred is not None and inferred.method == "draft_model"
    tp = speculative_config(
        draft_config("/d", draft_tensor_parallel_size=2), tensor_parallel_size=2
    )
    assert tp is not None and tp.method == "draft_model"


@pytest.mark.parametrize(
    ("given", "tp", "message"),
    [
        ({"method": "draft_model", "num_speculative_tokens": 2}, 1, "model must name the draft"),
        (draft_config("/d", draft_tensor_parallel_size=2), 1, "must be 1 or the target's"),
        (draft_config("/d", draft_tensor_parallel_size=1), 2, "one rank under a sharded target"),
        (draft_config("/d", max_model_len=0), 1, "max_model_len must be an integer of 1 or more"),
        (draft_config("/d", prompt_lookup_max=3), 1, "prompt_lookup_max is for method ngram"),
        (draft_config("/d", method="medusa"), 1, "'medusa' is not built yet (planned)"),
        ({"method": "suffix", "num_speculative_tokens": 1}, 1, "'suffix' is not built yet"),
    ],
)
def test_settings_refused(given, tp, message):
    with pytest.raises(ValueError, match="speculative_config") as caught:
        speculative_config(given, tensor_parallel_size=tp)
    assert message in str(caught.value)


def test_a_draft_of_another_vocabulary_is_refused(tiny_llama, model_factory):
    other = model_factory("LlamaForCausalLM", vocab_size=600)
    with pytest.raises(ValueError, match="vocabulary of 600 tokens and the target one of"):
        LLM(tiny_llama, speculative_config=draft_config(other), **SMALL)


def test_a_draft_context_longer_than_the_targets_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="max_model_len=256 must not exceed the target's"):
        LLM(tiny_llama, speculative_config=draft_config(tiny_llama, max_model_len=256), **SMALL)


def test_the_target_drafting_for_itself_accepts_every_draft(self_drafted, plain):
    model_runner = runner(self_drafted)
    assert isinstance(model_runner.proposer, DraftModelProposer)
    # the draft's layers hold their own cache in the same blocks
    assert len(model_runner.cache_layers) == 2 * len(model_runner.attention_layers)
    tokens, (drafts, draft_tokens, accepted), _ = generate(self_drafted, PROMPTS, GREEDY)
    assert tokens == plain
    assert drafts > 0 and accepted == draft_tokens
    # every position accepted as often as it was drafted: K drafts a step but near the end
    per_pos, _ = per_position_counts(self_drafted, PROMPTS, GREEDY)
    assert per_pos[0] == drafts == per_pos[1] and per_pos[K - 1] > 0


def test_an_unrelated_draft_changes_no_token(tiny_llama, unrelated_draft, plain):
    llm = LLM(tiny_llama, speculative_config=draft_config(unrelated_draft), **SMALL)
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == plain
    assert drafts > 0 and accepted < draft_tokens // 2


def test_prefix_cache_hits_read_the_drafts_cache(self_drafted, plain, tiny_llama, hf_greedy):
    """A prompt that continues an earlier one reads both models' keys and values from the prefix
    cache: a draft cache missing there (or written at rejected positions) would cost
    acceptances, never tokens; with the target as its own draft every draft still verifies."""
    longer = [list(prompt) + tokens[:20] for prompt, tokens in plain.items()]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    requests = [{"prompt_token_ids": ids} for ids in longer]
    tokens, (drafts, draft_tokens, accepted), cached = generate(self_drafted, requests, params)
    assert cached >= sum(len(ids) - 15 for ids in longer)
    assert drafts > 0 and accepted == draft_tokens
    for ids in longer:
        assert tokens[tuple(ids)] == hf_greedy(tiny_llama, ids, 12)


def test_chunked_prefill(tiny_llama, plain):
    chunked = LLM(
        tiny_llama,
        speculative_config=draft_config(tiny_llama),
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        **SMALL,
    )
    tokens, (drafts, draft_tokens, accepted), _ = generate(chunked, PROMPTS, GREEDY)
    assert tokens == plain
    assert drafts > 0 and accepted == draft_tokens


def test_preemption(tiny_llama, plain):
    """Too few blocks for all three requests: some are preempted and recomputed, the draft's
    cache with them."""
    small_cache = {**SMALL, "num_gpu_blocks_override": 16}
    llm = LLM(tiny_llama, speculative_config=draft_config(tiny_llama), **small_cache)
    scheduler = llm.llm_engine.engine_core.scheduler
    preempt = scheduler._preempt
    preempted = []

    def counted(request):
        preempted.append(request.request_id)
        return preempt(request)

    scheduler._preempt = counted
    try:
        tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    finally:
        del scheduler._preempt
    assert preempted
    assert tokens == plain
    assert drafts > 0 and accepted == draft_tokens


def test_lora_requests(tiny_llama, tmp_path):
    """The draft runs without the adapter: the target, with it, verifies."""
    from infernetes.runtime.lora.request import LoRARequest
    from infernetes.runtime.testing import make_tiny_lora

    adapter = make_tiny_lora(tiny_llama, tmp_path / "adapter")
    settings = {**SMALL, "enable_lora": True, "max_lora_rank": 8}
    llm = LLM(tiny_llama, speculative_config=draft_config(tiny_llama), **settings)
    lora = LoRARequest("adapter", 1, str(adapter))
    plain = LLM(tiny_llama, **settings)
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, GREEDY, lora_request=lora)]
    per_pos, outputs = per_position_counts(llm, PROMPTS, GREEDY, lora_request=lora)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert per_pos[0] > 0  # the draft without the adapter still guesses some of its tokens


def test_config_accepts_draft_model(tiny_llama, capsys):
    from infernetes.cli import main as cli_main

    argv = ["config", tiny_llama, "--speculative-config", json.dumps(draft_config(tiny_llama))]
    try:
        code = cli_main.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 0, capsys.readouterr().err


def test_sampling_at_temperature_one_keeps_the_targets_distribution(sharp_llama, monkeypatch):
    from infernetes.runtime.model_executor.sampler import SampledToken
    from infernetes.runtime.worker import model_runner

    from .spec_decode_sampling import ROOMY, verified_positions_p_values

    plain = LLM(sharp_llama, **ROOMY)
    drafted = LLM(sharp_llama, speculative_config=draft_config(sharp_llama), **ROOMY)
    prompt = SAMPLE_PROMPTS[1]
    p_values, accepted = verified_positions_p_values(plain, drafted, prompt)
    assert min(p_values) > 0.001 and accepted > 0
    # the test tells a rule that keeps every greedy draft from the target's sampling
    monkeypatch.setattr(
        model_runner,
        "accepted",
        lambda samples, drafts: [*map(SampledToken, drafts), samples[len(drafts)]],
    )
    assert min(verified_positions_p_values(plain, drafted, prompt)[0]) < 1e-6


def test_a_shorter_draft_context_stops_drafting_past_it(tiny_llama, plain):
    """Past the draft's max_model_len a request gets no more drafts; its tokens are unchanged."""
    short = draft_config(tiny_llama, max_model_len=32)
    llm = LLM(tiny_llama, speculative_config=short, **SMALL)
    assert runner(llm).proposer.max_model_len == 32
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == plain
    # every draft still verifies, but fewer steps have any than with the whole context
    _, (all_drafts, _, _), _ = generate(
        LLM(tiny_llama, speculative_config=draft_config(tiny_llama), **SMALL), PROMPTS, GREEDY
    )
    assert 0 < drafts < all_drafts and accepted == draft_tokens


@pytest.mark.slow
def test_tensor_parallel_draft(tiny_llama, plain):
    """Target and draft sharded over two ranks (gloo): each rank runs its shard of the draft."""
    llm = LLM(
        tiny_llama,
        tensor_parallel_size=2,
        speculative_config=draft_config(tiny_llama, draft_tensor_parallel_size=2),
        **SMALL,
    )
    try:
        totals, outputs = per_position_counts(llm, PROMPTS, GREEDY)
        assert {tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in outputs} == plain
        assert totals[0] > 0  # drafts were proposed and accepted
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_structured_output_beside_drafted_requests(tiny_llama, backend):
    """JSON-schema and regex requests under a draft model: the tokens a run without
    speculation emits, valid, while the unconstrained requests beside them are drafted (a
    constrained request decodes one token a step: its grammar's mask covers one position)."""
    import re

    from infernetes.runtime.sampling_params import StructuredOutputsParams

    from .test_engine_structured_output import REGEX, SCHEMA, _is_answer

    def params(kind: str, spec) -> SamplingParams:
        constraint = StructuredOutputsParams(kind, spec, compact=True)
        return SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=constraint)

    requests = [*PROMPTS, *SAMPLE_PROMPTS[:2]]
    sampling = [GREEDY] * len(PROMPTS) + [params("json", SCHEMA), params("regex", REGEX)]
    settings = {**SMALL, "structured_outputs_config": {"backend": backend}}
    expected = LLM(tiny_llama, **settings).generate(requests, sampling)
    llm = LLM(tiny_llama, speculative_config=draft_config(tiny_llama), **settings)
    per_pos, outputs = per_position_counts(llm, requests, sampling)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
    assert per_pos[0] > 0  # the unconstrained requests were drafted
    assert _is_answer(outputs[-2].outputs[0].text)
    assert re.fullmatch(REGEX, outputs[-1].outputs[0].text)
