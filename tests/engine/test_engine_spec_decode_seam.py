"""Multi-token steps: a proposer's draft tokens are scheduled with a request's next step, the
model runner verifies them, and the step adds every token that verified. The trivial proposers
here (none, the target's own tokens, always-wrong tokens) leave the tokens unchanged: greedy,
under penalties and with a seed; stop conditions cut a step's tokens where they hit."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
import torch
from infernetes.runtime.spec_decode.proposer import NoProposer
from infernetes.runtime.testing import SAMPLE_PROMPTS
from infernetes.runtime.worker.request_state import CachedRequestState

from infernetes import LLM, SamplingParams

SMALL = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=48, block_size=8)
PROMPTS = SAMPLE_PROMPTS[:3]


class TargetTokensProposer:
    """Proposes the next ``k`` tokens of a continuation the target model was seen to produce."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], k: int) -> None:
        self.continuations = continuations
        self.k = k

    def propose(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        sampling: Sequence[int],
        hidden: torch.Tensor,
    ) -> list[list[int]]:
        drafts = []
        for request in (batch[i] for i in sampling):
            done = request.num_output_tokens
            known = self.continuations[tuple(request.prompt_token_ids)]
            drafts.append(known[done : done + self.k])
        return drafts


class WrongTokensProposer:
    """Proposes tokens that disagree with what the request just sampled (mostly rejected)."""

    def propose(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        sampling: Sequence[int],
        hidden: torch.Tensor,
    ) -> list[list[int]]:
        return [[(batch[i].token_ids[-1] + 1 + j) % 512 for j in range(3)] for i in sampling]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, **SMALL)


def runner(llm):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner


def generate(llm, params, proposer=None):
    """Outputs (prompt ids, tokens) and the steps the engine took."""
    model_runner = runner(llm)
    model_runner.proposer = proposer or NoProposer()
    steps = []
    execute = model_runner.execute_model

    def counted(scheduler_output):
        steps.append(scheduler_output.total_num_scheduled_tokens)
        return execute(scheduler_output)

    model_runner.execute_model = counted
    try:
        outputs = llm.generate(PROMPTS, params)
    finally:
        del model_runner.execute_model
        model_runner.proposer = NoProposer()
    tokens = {tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in outputs}
    return tokens, len(steps)


GREEDY = SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True)


def test_greedy_tokens_unchanged_by_any_proposer(llm, tiny_llama, hf_greedy):
    plain, plain_steps = generate(llm, GREEDY)
    for prompt, tokens in plain.items():
        assert tokens == hf_greedy(tiny_llama, list(prompt), 17)
    verified, verified_steps = generate(llm, GREEDY, TargetTokensProposer(plain, k=4))
    assert verified == plain
    # one prefill step, then each step takes four drafts and the next token: 16 tokens in 4
    assert verified_steps == 1 + 4 < plain_steps == 17
    wrong, _ = generate(llm, GREEDY, WrongTokensProposer())
    assert wrong == plain


def test_stop_conditions_cut_a_steps_tokens(llm):
    plain, _ = generate(llm, GREEDY)
    proposer = TargetTokensProposer(plain, k=4)
    short = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert generate(llm, short, proposer)[0] == {p: t[:6] for p, t in plain.items()}
    first = next(iter(plain.values()))
    stop = SamplingParams(temperature=0.0, max_tokens=17, stop_token_ids=[first[7]])
    expected, _ = generate(llm, stop)
    assert generate(llm, stop, proposer)[0] == expected
    assert len(expected[next(iter(plain))]) == 8  # it stopped inside a step of five tokens


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(
            temperature=0.0,
            max_tokens=17,
            ignore_eos=True,
            repetition_penalty=1.5,
            frequency_penalty=0.5,
            presence_penalty=0.3,
        ),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=17, ignore_eos=True, seed=7),
    ],
    ids=["penalties", "seeded"],
)
def test_each_draft_position_samples_with_the_history_before_it(llm, params):
    """A wrong history at a draft position (penalties, or a seeded draw out of order) would
    reject the target's own tokens there and emit another."""
    plain, plain_steps = generate(llm, params)
    verified, steps = generate(llm, params, TargetTokensProposer(plain, k=4))
    assert verified == plain
    assert steps == 1 + 4 < plain_steps


def test_drafts_counted_in_the_step_statistics(llm):
    plain, _ = generate(llm, GREEDY)
    scheduler = llm.llm_engine.engine_core.scheduler
    update = scheduler.update_from_output
    counts = [0, 0]

    def counted(scheduler_output, model_output):
        updated, iteration = update(scheduler_output, model_output)
        counts[0] += iteration.num_draft_tokens
        counts[1] += iteration.num_accepted_tokens
        return updated, iteration

    scheduler.update_from_output = counted
    try:
        generate(llm, GREEDY, TargetTokensProposer(plain, k=4))
        # 3 prompts, 3 steps of 4 drafts, all accepted; the last step's token needs none
        assert counts == [3 * 12, 3 * 12]
        counts[:] = [0, 0]
        generate(llm, GREEDY, WrongTokensProposer())
        assert counts[0] > 0 and counts[1] < counts[0]
    finally:
        del scheduler.update_from_output


def test_a_constrained_request_beside_drafted_ones(llm):
    """A constrained request's masks land on its own rows among the drafted requests' rows; the
    drafts it gets (another request's tokens) the grammar mostly refuses, and it stays valid."""
    from infernetes.runtime.sampling_params import StructuredOutputsParams

    plain, _ = generate(llm, GREEDY)
    model_runner = runner(llm)
    model_runner.proposer = TargetTokensProposer(plain, k=4)
    choice = SamplingParams(
        temperature=0.0,
        max_tokens=17,
        structured_outputs=StructuredOutputsParams("choice", ["yes", "no"]),
    )
    try:
        outputs = llm.generate([*PROMPTS, PROMPTS[0]], [GREEDY, GREEDY, GREEDY, choice])
    finally:
        model_runner.proposer = NoProposer()
    assert [list(o.outputs[0].token_ids) for o in outputs[:3]] == list(plain.values())
    assert outputs[3].outputs[0].text in ("yes", "no")


REGEX = r"[0-9]{3}-(ok|ko)-[a-z]{3}"


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
@pytest.mark.parametrize("kind", ["json", "regex"])
def test_structured_output_masks_every_draft_position(tiny_llama, backend, kind):
    """A constrained request's drafts each get the mask of the grammar advanced through the
    drafts before it: proposing its own constrained tokens, every draft is accepted (a position
    masked as another would sample off the grammar's path and reject it) and the output is the
    one without drafts, valid."""
    from infernetes.runtime.sampling_params import StructuredOutputsParams

    from .test_engine_structured_output import SCHEMA, _is_answer

    llm = LLM(tiny_llama, **SMALL, structured_outputs_config={"backend": backend})
    spec, valid = (SCHEMA, _is_answer) if kind == "json" else (REGEX, _matches_regex)
    constraint = StructuredOutputsParams(kind, spec, compact=True)
    params = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=constraint)
    plain, plain_steps = generate(llm, params)
    scheduler = llm.llm_engine.engine_core.scheduler
    update = scheduler.update_from_output
    counts = [0, 0]

    def counted(scheduler_output, model_output):
        updated, iteration = update(scheduler_output, model_output)
        counts[0] += iteration.num_draft_tokens
        counts[1] += iteration.num_accepted_tokens
        return updated, iteration

    scheduler.update_from_output = counted
    try:
        verified, steps = generate(llm, params, TargetTokensProposer(plain, k=4))
    finally:
        del scheduler.update_from_output
    assert verified == plain
    assert counts[0] > 0 and counts[1] == counts[0]
    assert steps < plain_steps
    tokenizer = llm.get_tokenizer()
    for tokens in verified.values():
        assert valid(tokenizer.decode(tokens, skip_special_tokens=True))


def _matches_regex(text: str) -> bool:
    return re.fullmatch(REGEX, text) is not None
