"""Verifying draft tokens in the step that computes them.

A request with ``k`` drafts after its last token has ``k + 1`` positions that predict a token:
after the last token, and after each draft. Each is sampled as if the drafts before it had been
accepted (``DraftPosition`` shows the sampler that history: penalties, ``min_tokens`` and logits
processors see it). The step keeps the samples up to and including the first that differs from
its draft (``accepted``). For a proposer whose drafts are single tokens rather than
distributions (n-gram, greedy drafts), this is rejection sampling: a draft ``d`` is kept with the
probability the target gives it, and otherwise the sample, drawn from the target, is not ``d``:
the tokens follow the target's distribution exactly. Greedy requests get the tokens they would
get one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infernetes.runtime.model_executor.sampler import SampledToken
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.worker.request_state import CachedRequestState


class DraftPosition:
    """A request as the sampler sees it at one verified position: its tokens before the
    position's prediction (the real ones, then ``index`` of its drafts)."""

    def __init__(self, state: CachedRequestState, index: int) -> None:
        self.state = state
        self._end = state.num_tokens - state.num_drafts + index

    @property
    def request_id(self) -> str:
        return self.state.request_id

    @property
    def sampling_params(self) -> SamplingParams | None:
        return self.state.sampling_params

    @property
    def generator(self) -> Any:
        return self.state.generator

    @property
    def eos_token_id(self) -> int | None:
        return self.state.eos_token_id

    @property
    def error(self) -> Exception | None:
        return self.state.error

    @error.setter
    def error(self, error: Exception | None) -> None:
        self.state.error = error

    @property
    def prompt_token_ids(self) -> Sequence[int]:
        return self.state.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.state.token_ids[self.state.num_prompt_tokens : self._end]

    @property
    def num_output_tokens(self) -> int:
        return self._end - self.state.num_prompt_tokens


def sampling_positions(state: CachedRequestState) -> list[CachedRequestState | DraftPosition]:
    """What the sampler gets for ``state``'s rows: itself alone without drafts."""
    if not state.num_drafts:
        return [state]
    return [DraftPosition(state, index) for index in range(state.num_drafts + 1)]


def accepted(samples: Sequence[SampledToken], drafts: Sequence[int]) -> list[SampledToken]:
    """The samples up to and including the first that is not its position's draft."""
    for index, draft in enumerate(drafts):
        if samples[index].token_id != draft:
            return list(samples[: index + 1])
    return list(samples)
