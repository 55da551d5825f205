"""N-gram prompt lookup (vLLM's ``method: "ngram"``): a request's next tokens are guessed from
its own history. Where its last tokens occurred before (in the prompt or the output), the tokens
that followed then are proposed. It needs no model and suits text that repeats its context
(code edits, summaries, extraction)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from infernetes.runtime.config import SpeculativeConfig
from infernetes.runtime.worker.request_state import CachedRequestState
from numpy.lib.stride_tricks import sliding_window_view


def lookup(token_ids: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest of
    ``token_ids``' last ``max_n`` down to ``min_n`` tokens; [] when none occurred."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    n = min(max_n, len(tokens) - 1)  # an earlier occurrence ends before the last token
    if n < min_n:
        return []
    # -1 (no token's id) before the history lets an occurrence start near its beginning
    history = np.concatenate([np.full(n - 1, -1, dtype=np.int64), tokens[:-1]])
    # row e - 1 holds the n tokens that end (exclusive) at position e, for e in 1..len - 1
    windows = sliding_window_view(history, n)
    equal = windows == tokens[-n:]
    # how many of the last tokens each position's preceding tokens match, read right to left
    lengths = np.cumprod(equal[:, ::-1], axis=1).sum(axis=1)
    longest = int(lengths.max())
    if longest < min_n:
        return []
    end = int(np.flatnonzero(lengths == longest)[-1]) + 1
    return tokens[end : end + k].tolist()


class NgramProposer:
    """Proposes each request's ``lookup`` drafts; a request whose prompt came as embeddings looks
    up its output alone (its prompt has no token ids)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.k = config.num_speculative_tokens

    def propose(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        sampling: Sequence[int],
        hidden: torch.Tensor,
    ) -> list[list[int]]:
        requests = [batch[i] for i in sampling]
        return [
            lookup(
                r.token_ids if r.prompt_embeds is None else r.output_token_ids,
                self.min_n,
                self.max_n,
                self.k,
            )
            for r in requests
        ]
