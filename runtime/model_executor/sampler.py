"""Sampler: turn each request's logits into its next token, by that request's own parameters.

Order, as in vLLM v1: logprobs are taken from the raw logits; then logit bias, allowed tokens,
``min_tokens`` (stop tokens masked), penalties and logits processors; greedy rows take the argmax;
the others apply temperature, ``min_p``, ``top_k``, ``top_p`` (all rows at once) and sample by
inverse transform: one uniform draw per row, searched in the row's cumulative distribution (top_p
without top_k by rejection: drawn again while outside the nucleus, no sort of the vocabulary). A
request with a ``seed`` draws from its own generator, so its tokens do not depend on what else is
in the batch. On a GPU penalties and logprobs are batched too (penalties.py, ``top_logprobs``: no
launch or copy per row); on a CPU they go row by row, each row staying in the caches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from infernetes.runtime.model_executor.penalties import apply_penalties, needs_penalties
from infernetes.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class SamplingRequest(Protocol):
    """What the sampler reads of a request (a worker's request state; the engine's Request)."""

    request_id: str
    sampling_params: SamplingParams | None
    generator: Any  # torch.Generator when the params carry a seed
    eos_token_id: int | None
    error: Exception | None  # set here when its logits processor raises

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def num_output_tokens(self) -> int: ...


@dataclass
class TopLogprobs:
    """The logprob and rank of a chosen token and the ``k`` most likely tokens at one position."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class SampledToken:
    token_id: int
    logprobs: TopLogprobs | None = None


def _top_logprobs(logprobs_row: torch.Tensor, token_id: int, k: int) -> TopLogprobs:
    chosen = logprobs_row[token_id]
    rank = int((logprobs_row > chosen).sum()) + 1
    if k > 0:
        values, ids = torch.topk(logprobs_row, min(k, logprobs_row.shape[-1]))
        top_ids, top_values = ids.tolist(), values.tolist()
    else:
        top_ids, top_values = [], []
    return TopLogprobs(token_id, float(chosen), rank, top_ids, top_values)


def top_logprobs(
    logprobs: torch.Tensor, tokens: Sequence[int], ks: Sequence[int]
) -> list[TopLogprobs]:
    """``_top_logprobs`` of every row of ``logprobs`` ``[R, V]`` at once: one copy to the host
    for all rows instead of three a row (on a GPU, each copy waits for the device)."""
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    k = min(max(ks, default=0), logprobs.shape[-1])
    top_values: list[list[float]] = [[] for _ in tokens]
    top_ids: list[list[int]] = [[] for _ in tokens]
    if k > 0:
        values, ids = torch.topk(logprobs, k, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    return [
        TopLogprobs(token, value, rank, top_ids[r][: ks[r]], top_values[r][: ks[r]])
        for r, (token, value, rank) in enumerate(
            zip(tokens, chosen[:, 0].tolist(), ranks, strict=True)
        )
    ]


def _apply_penalties(
    row: torch.Tensor, request: SamplingRequest, params: SamplingParams
) -> torch.Tensor:
    vocab = row.shape[-1]
    output = torch.tensor(request.output_token_ids, dtype=torch.long, device=row.device)
    output = output[output < vocab]
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[
            torch.tensor(request.prompt_token_ids, dtype=torch.long, device=row.device).clamp(
                max=vocab - 1
            )
        ] = True
        seen[output] = True
        penalised = torch.where(
            row > 0, row / params.repetition_penalty, row * params.repetition_penalty
        )
        row = torch.where(seen, penalised, row)
    if params.frequency_penalty or params.presence_penalty:
        counts = torch.bincount(output, minlength=vocab).to(row.dtype)
        row = (
            row
            - params.frequency_penalty * counts
            - params.presence_penalty * (counts > 0).to(row.dtype)
        )
    return row


def _params(request: SamplingRequest) -> SamplingParams:
    params = request.sampling_params
    assert params is not None, "a pooling request never reaches the sampler"
    return params


def _process(row: torch.Tensor, request: SamplingRequest, penalties: bool = True) -> torch.Tensor:
    """Bias, allowed tokens, ``min_tokens``, penalties (unless the batch applies them) and
    logits processors on one row, in that order."""
    params = _params(request)
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=row.device)
        bias = torch.tensor(list(params.logit_bias.values()), dtype=row.dtype, device=row.device)
        row = row.index_add(0, ids, bias)
    if params.allowed_token_ids is not None:
        mask = torch.full_like(row, float("-inf"))
        ids = torch.tensor(params.allowed_token_ids, dtype=torch.long, device=row.device)
        mask[ids] = 0.0
        row = row + mask
    if request.num_output_tokens < params.min_tokens:
        stop_ids = set(params.all_stop_token_ids)
        if request.eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(request.eos_token_id)
        if stop_ids:
            row = row.clone()
            row[torch.tensor(sorted(stop_ids), dtype=torch.long, device=row.device)] = float("-inf")
    if penalties and needs_penalties(params):
        row = _apply_penalties(row, request, params)
    for processor in params.logits_processors or ():
        try:
            row = processor(request.output_token_ids, row)
        except Exception as error:  # a faulty processor fails its own request, not the batch
            logger.exception("logits processor of request %s failed", request.request_id)
            request.error = error
    return row


def _finite(rows: torch.Tensor) -> torch.Tensor:
    """Rows every later step can take, whatever the logits (in place): NaN counts as -inf, +inf
    tokens share the row, and a row with nothing left makes every token equally likely. Done with
    the extremes of the dtype, so a row always has a finite maximum and its weights a positive sum
    (a NaN or zero sum would draw a token id past the vocabulary)."""
    info = torch.finfo(rows.dtype)
    return rows.nan_to_num_(nan=info.min, posinf=info.max, neginf=info.min)


def filter_logits(
    logits: torch.Tensor, params: list[SamplingParams]
) -> tuple[torch.Tensor, list[float]]:
    """Temperature, min_p, top_k and top_p on rows of logits `[R, V]`, each row by its own
    parameters, all rows at once; filtered-out tokens become -inf. Returns the rows and the top_p
    each row still needs at the draw: a row with top_k has its top_p applied here, among its k
    candidates; a row without one leaves top_p to `Sampler` (no sort of the whole vocabulary)."""
    device, vocab = logits.device, logits.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device)
    rows = _finite(logits / temperature[:, None])
    min_p = [p.min_p for p in params]
    if any(m > 0.0 for m in min_p):
        probs = torch.softmax(rows, dim=-1)
        threshold = torch.tensor(min_p, dtype=rows.dtype, device=device)[:, None] * probs.amax(
            dim=-1, keepdim=True
        )
        rows = rows.masked_fill(probs < threshold, float("-inf"))
    has_top_k = [0 < p.top_k < vocab for p in params]
    nucleus = [1.0 if k else p.top_p for p, k in zip(params, has_top_k, strict=True)]
    if not any(has_top_k):
        return rows, nucleus
    # only the rows' top candidates need ordering; a row without top_k keeps them all here
    top_k = [p.top_k if k else vocab for p, k in zip(params, has_top_k, strict=True)]
    ordered, order = torch.topk(rows, max(top_k), dim=-1)
    keep = (
        torch.arange(ordered.shape[-1], device=device)[None, :]
        < torch.tensor(top_k, device=device)[:, None]
    )
    ordered = ordered.masked_fill(~keep, float("-inf"))
    top_p = [p.top_p if k else 1.0 for p, k in zip(params, has_top_k, strict=True)]
    if min(top_p) < 1.0:
        probs = torch.softmax(ordered, dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) > torch.tensor(
            top_p, dtype=probs.dtype, device=device
        )[:, None]
        ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.full_like(rows, float("-inf")).scatter(1, order, ordered), nucleus


class Sampler:
    def __init__(self, seed: int | None = None, batched: bool | None = None) -> None:
        """``batched``: penalties and logprobs for all rows at once (a GPU's way: no launch or
        copy per row), or row by row (a CPU's: each row stays in the caches); None picks by the
        logits' device."""
        self.batched = batched
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()  # non-deterministic, without touching torch's global RNG
        else:
            self.generator.manual_seed(seed)

    def __call__(
        self, logits: torch.Tensor, requests: Sequence[SamplingRequest]
    ) -> list[SampledToken]:
        logits = logits.float()
        batched = self.batched if self.batched is not None else logits.device.type != "cpu"
        wants_logprobs = any(_params(r).logprobs is not None for r in requests)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if wants_logprobs else None
        processed = [i for i, r in enumerate(requests) if _needs_processing(r)]
        if processed:  # the rare per-request processing, row by row; then the batch goes on as one
            logits = logits.clone()
            penalised = self._batch_penalties(logits, requests, processed) if batched else set()
            for i in processed:
                if penalised and i in penalised and not _params(requests[i]).logits_processors:
                    continue  # nothing left to do row by row
                row = _process(logits[i], requests[i], penalties=i not in penalised)
                # a NaN from a bias or processor is never the argmax of a greedy row
                logits[i] = row.nan_to_num(
                    nan=float("-inf"), posinf=float("inf"), neginf=float("-inf")
                )
        greedy = [i for i, r in enumerate(requests) if _params(r).greedy]
        if len(greedy) == len(requests):  # the common all-greedy batch: no row copy
            tokens = logits.argmax(dim=-1).tolist()
        else:
            tokens = [0] * len(requests)
            if greedy:
                for i, token in zip(greedy, logits[greedy].argmax(dim=-1).tolist(), strict=True):
                    tokens[i] = token
            sampled = [i for i, r in enumerate(requests) if not _params(r).greedy]
            for part in _row_groups(sampled, logits):
                rows, nucleus = filter_logits(logits[part], [_params(requests[i]) for i in part])
                for i, token in zip(
                    part, self._sample(rows, [requests[i] for i in part], nucleus), strict=True
                ):
                    tokens[i] = token
        results = [SampledToken(token) for token in tokens]
        if raw_logprobs is not None:
            wanting = [i for i, r in enumerate(requests) if _params(r).logprobs is not None]
            ks = [_params(requests[i]).logprobs or 0 for i in wanting]
            if batched:
                rows = raw_logprobs[torch.tensor(wanting, device=raw_logprobs.device)]
                found = top_logprobs(rows, [tokens[i] for i in wanting], ks)
            else:
                found = [
                    _top_logprobs(raw_logprobs[i], tokens[i], k)
                    for i, k in zip(wanting, ks, strict=True)
                ]
            for i, logprobs in zip(wanting, found, strict=True):
                results[i].logprobs = logprobs
        return results

    @staticmethod
    def _batch_penalties(
        logits: torch.Tensor, requests: Sequence[SamplingRequest], rows: list[int]
    ) -> set[int]:
        """Penalties of ``rows`` in one pass (in place, NaN-free as ``_process`` leaves them);
        the rows done. A row's bias and masks come before its penalties, so a row with any is
        left to ``_process`` (rare: a penalty is the common case)."""
        plain = [
            i
            for i in rows
            if needs_penalties(_params(requests[i])) and not _needs_bias_or_masks(requests[i])
        ]
        if not plain:
            return set()
        index = torch.tensor(plain, device=logits.device)
        logits[index] = apply_penalties(
            logits[index],
            [_params(requests[i]) for i in plain],
            [requests[i].prompt_token_ids for i in plain],
            [requests[i].output_token_ids for i in plain],
        ).nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
        return set(plain)

    def _sample(
        self, rows: torch.Tensor, requests: Sequence[SamplingRequest], nucleus: list[float]
    ) -> list[int]:
        """One token per row of filtered logits, by inverse transform: a uniform draw per row,
        found in the row's cumulative distribution. A seeded request draws from its own generator,
        the others from the engine's, all on the host (one number a row and draw), so a seeded
        request's tokens do not depend on the batch and no row needs device work of its own.

        top_p (`nucleus`) by rejection, without sorting the vocabulary: a drawn token is kept
        when the probability ranked above it is at most top_p (the definition of the nucleus);
        otherwise no token as likely as it or less can be in the nucleus, so the row draws again
        among the more likely ones. The accepted tokens follow the nucleus distribution exactly."""
        weights = torch.exp(rows - rows.amax(dim=-1, keepdim=True))  # unnormalised probabilities
        drawn = self._draw(weights, requests)
        tokens = drawn.tolist()
        pending = [i for i, top_p in enumerate(nucleus) if top_p < 1.0]
        if not pending:
            return tokens
        index = torch.tensor(pending, device=weights.device)
        drawn, candidates = drawn[index], weights[index]
        top_p = torch.tensor(
            [nucleus[i] for i in pending], dtype=weights.dtype, device=weights.device
        )
        limit = top_p * candidates.sum(dim=-1)
        while pending:
            chosen = candidates.gather(1, drawn[:, None])
            above = torch.where(candidates > chosen, candidates, 0.0).sum(dim=-1)
            rejected = (above > limit).tolist()
            keep = [k for k, no in enumerate(rejected) if no]
            pending = [pending[k] for k in keep]
            if pending:
                keep_index = torch.tensor(keep, device=weights.device)
                candidates, limit = candidates[keep_index], limit[keep_index]
                # no token as likely as the rejected one, or less, is in the nucleus
                floor = chosen[keep_index]
                drawn = self._draw(
                    torch.where(candidates > floor, candidates, 0.0), [requests[i] for i in pending]
                )
                for i, token in zip(pending, drawn.tolist(), strict=True):
                    tokens[i] = token
        return tokens

    def _draw(self, weights: torch.Tensor, requests: Sequence[SamplingRequest]) -> torch.Tensor:
        """A token per row of unnormalised probabilities, from one host uniform per row."""
        shared = iter(
            torch.rand(
                sum(r.generator is None for r in requests), generator=self.generator
            ).tolist()
        )
        draws = [
            next(shared) if r.generator is None else float(torch.rand((), generator=r.generator))
            for r in requests
        ]
        cdf = torch.cumsum(weights, dim=-1)
        total = cdf[:, -1:].contiguous()
        target = torch.tensor(draws, dtype=cdf.dtype, device=cdf.device)[:, None] * total
        tokens = torch.searchsorted(cdf, target, right=True)
        # a draw that rounds up to the total would land past the last token with any probability:
        # that token is where the cumulative sum first reaches the total
        return torch.minimum(tokens, torch.searchsorted(cdf, total))[:, 0]


_CPU_GROUP_BYTES = 4 << 20


def _row_groups(rows: list[int], logits: torch.Tensor) -> list[list[int]]:
    """The sampled rows in groups: all at once on a GPU; on a CPU a few MB of logits at a time,
    which stay in its caches through the filter and draw passes (about 2x faster at 256 rows)."""
    if logits.device.type != "cpu":
        return [rows]
    size = max(1, _CPU_GROUP_BYTES // (logits.shape[-1] * logits.element_size()))
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _needs_bias_or_masks(request: SamplingRequest) -> bool:
    params = _params(request)
    return bool(
        params.logit_bias
        or params.allowed_token_ids is not None
        or request.num_output_tokens < params.min_tokens
    )


def _needs_processing(request: SamplingRequest) -> bool:
    params = _params(request)
    return bool(
        params.logit_bias
        or params.allowed_token_ids is not None
        or params.logits_processors
        or request.num_output_tokens < params.min_tokens
        or params.repetition_penalty != 1.0
        or params.frequency_penalty
        or params.presence_penalty
    )


def prompt_logprobs(logits: torch.Tensor, next_tokens: list[int], k: int) -> list[TopLogprobs]:
    """Logprobs of ``next_tokens`` given the logits at the positions before them."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [_top_logprobs(logprobs[i], token, k) for i, token in enumerate(next_tokens)]
