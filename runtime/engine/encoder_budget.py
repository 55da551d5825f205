"""The encoder's share of a step, as vLLM's scheduler keeps it: a chunk that reaches a
multimodal item whose encoder output the workers do not hold yet runs the vision tower over the
whole item in that step, so each step may encode at most ``max_num_encoder_input_tokens`` of
items (vLLM's compute budget), and the outputs the workers hold between steps (an item a chunk
splits stays until the last chunk reading it) stay within the encoder cache's size. Both are
``max_num_batched_tokens`` by default, as in vLLM.

The first item a step encodes is always allowed, however large and whatever is held: an item
larger than a whole budget is encoded alone (vLLM raises both budgets to its largest item, so
such an item is never refused either), and no request waits for ever on outputs held for
another, or for itself (a prompt that repeats an image holds it until its last use). What the workers hold mirrors the model runner's rule exactly: an item
is held from the step that first reaches it until the step whose chunk ends at or past its end,
or until its request is preempted (a held item could otherwise keep the one before it, which the
request computes again first, from ever fitting).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infernetes.runtime.engine.request import Request


class EncoderBudget:
    """What is left of one step's encoder budget while the step is scheduled."""

    def __init__(self, compute_tokens: int, cache_tokens: int, held: Iterable[Request]) -> None:
        self.compute_left = compute_tokens
        self.cache_free = cache_tokens - sum(
            length for request in held for length in request.encoder_held.values()
        )
        self.num_tokens = 0  # encoder tokens this step (SchedulerOutput.num_encoder_tokens)

    def fit(self, request: Request, start: int, chunk: int) -> int:
        """``chunk`` (from position ``start``) cut before the first item it would encode that
        does not fit what is left; 0 when that item began before ``start``."""
        pending = 0  # of the items this chunk encodes before the one looked at
        for offset, length in _new_items(request, start, start + chunk):
            alone = self.num_tokens == 0 and not pending  # the step's first item
            fits = pending + length <= min(self.compute_left, self.cache_free)
            if not (fits or alone):
                return max(offset - start, 0)
            pending += length
        return chunk

    def charge(self, request: Request, start: int, num_new: int) -> None:
        """``request`` computes ``num_new`` tokens from ``start`` this step: the items they reach
        are encoded (held by the workers) and those they pass are released."""
        end = start + num_new
        for feature in request.mm_features:
            if (
                feature.offset < end
                and start < feature.end
                and (feature.identifier not in request.encoder_held)
            ):
                request.encoder_held[feature.identifier] = feature.length
                self.compute_left -= feature.length
                self.cache_free -= feature.length
                self.num_tokens += feature.length
        # released after this step (the workers free them once its forward has read them)
        ahead = {f.identifier for f in request.mm_features if f.end > end}
        for identifier in set(request.encoder_held) - ahead:  # no later chunk reads it
            del request.encoder_held[identifier]


def _new_items(request: Request, start: int, end: int) -> list[tuple[int, int]]:
    """(offset, length) of each item [start, end) reaches whose output is not held, once per
    identifier (a prompt that repeats an item encodes it once)."""
    seen: set[str] = set(request.encoder_held)
    items = []
    for feature in request.mm_features:
        if feature.offset < end and start < feature.end and feature.identifier not in seen:
            seen.add(feature.identifier)
            items.append((feature.offset, feature.length))
    return items
