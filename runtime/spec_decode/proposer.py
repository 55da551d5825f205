"""What proposes draft tokens: after a step, for each request that sampled, the tokens it guesses
come next (vLLM V1's proposers run in the model runner the same way). The scheduler gives them to
the request's next step, which verifies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from infernetes.runtime.worker.request_state import CachedRequestState


class Proposer(Protocol):
    def propose(self, requests: Sequence[CachedRequestState]) -> list[list[int]]:
        """Draft tokens for each request (its tokens so far in ``token_ids``); [] for none."""
        ...


class NoProposer:
    """Proposes nothing: every step adds one token per request (the default)."""

    def propose(self, requests: Sequence[CachedRequestState]) -> list[list[int]]:
        return [[] for _ in requests]
