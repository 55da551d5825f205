"""What proposes draft tokens: after a step, for each request that sampled, the tokens it guesses
come next (vLLM V1's proposers run in the model runner the same way): n-gram lookup
(``ngram.py``) and a draft model (``draft_model.py``). The scheduler gives them to
the request's next step, which verifies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from infernetes.runtime.worker.request_state import CachedRequestState


class Proposer(Protocol):
    def propose(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        sampling: Sequence[int],
        hidden: torch.Tensor,
    ) -> list[list[int]]:
        """Draft tokens for each ``batch[i]``, ``i`` in ``sampling`` (the requests that sampled,
        their tokens so far in ``token_ids``); [] for none. ``batch`` and ``num_scheduled`` are
        the whole step, which a draft model computes too; ``hidden`` the target's last hidden
        states of the step's tokens, in order (an EAGLE head's input)."""
        ...


class NoProposer:
    """Proposes nothing: every step adds one token per request (the default)."""

    def propose(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        sampling: Sequence[int],
        hidden: torch.Tensor,
    ) -> list[list[int]]:
        return [[] for _ in sampling]
