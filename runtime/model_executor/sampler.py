"""Sampler: turn each request's logits into its next token, by that request's own parameters.

Order, as in vLLM v1: logprobs are taken from the raw logits; then logit bias, allowed tokens,
``min_tokens`` (stop tokens masked), penalties and logits processors (a request's own, then the
server's ``--logits-processors`` over the whole batch), then structured output's
bitmask (``apply_grammar_bitmask``, the engine core's); greedy rows take the argmax;
the others apply temperature, ``min_p``, ``top_k``, ``top_p`` (all rows at once) and sample by
inverse transform: one uniform draw per row, searched in the row's cumulative distribution (top_p
without top_k by rejection: drawn again while outside the nucleus, no sort of the vocabulary). A
request with a ``seed`` draws from its own generator, so its tokens do not depend on what else is
in the batch. On a GPU penalties and logprobs are batched too (penalties.py, ``top_logprobs``: no
launch or copy per row); on a CPU they go row by row, each row staying in the caches.

The stages, each a function over the step's ``SamplingMetadata`` (read once from the requests'
parameters, as vLLM V1's sampler reads its own): ``process_logits``, ``Sampler._sample``
(``filter_logits`` on a group of rows, then the draw) and ``gather_logprobs``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from infernetes.runtime.model_executor.penalties import apply_penalties, needs_penalties
from infernetes.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    from infernetes.runtime.engine.scheduler_output import GrammarBitmask
    from infernetes.runtime.worker.logits_processor_batch import LogitsProcessorBatch

logger = logging.getLogger(__name__)


class SamplingRequest(Protocol):
    """What the sampler reads of a request (a worker's request state; the engine's Request)."""

    error: Exception | None  # set here when its logits processor raises

    @property
    def request_id(self) -> str: ...

    @property
    def sampling_params(self) -> SamplingParams | None: ...

    @property
    def generator(self) -> Any: ...  # torch.Generator when the params carry a seed

    @property
    def eos_token_id(self) -> int | None: ...

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


def _needs_bias_or_masks(request: SamplingRequest, params: SamplingParams) -> bool:
    return bool(
        params.logit_bias
        or params.allowed_token_ids is not None
        or request.num_output_tokens < params.min_tokens
    )


@dataclass
class SamplingMetadata:
    """What a step samples by, read once from its requests' SamplingParams (vLLM V1's
    ``SamplingMetadata``): the rows each stage works on. The draw's per-row values become
    tensors per group of rows (``FilterParams``), since a CPU draws a few rows at a time."""

    requests: Sequence[SamplingRequest]
    params: list[SamplingParams]
    greedy: list[int]  # rows that take the argmax
    random: list[int]  # rows that draw
    processed: list[int]  # rows with a bias, a mask, min_tokens, penalties or logits processors
    # of those, rows whose penalties are applied together (batched, and no bias or mask first)
    penalised_together: list[int]
    logprobs: list[int]  # rows that want logprobs
    num_logprobs: list[int]  # and how many top ones each

    @classmethod
    def from_requests(cls, requests: Sequence[SamplingRequest], batched: bool) -> SamplingMetadata:
        params = [_params(r) for r in requests]
        processed, penalised_together = _processed_rows(requests, params, batched)
        logprobs = [i for i, p in enumerate(params) if p.logprobs is not None]
        return cls(
            requests,
            params,
            greedy=[i for i, p in enumerate(params) if p.greedy],
            random=[i for i, p in enumerate(params) if not p.greedy],
            processed=processed,
            penalised_together=penalised_together,
            logprobs=logprobs,
            num_logprobs=[params[i].logprobs or 0 for i in logprobs],
        )


def _processed_rows(
    requests: Sequence[SamplingRequest], params: list[SamplingParams], batched: bool
) -> tuple[list[int], list[int]]:
    """The rows with any per-request processing, and those of them whose penalties can go
    together: a row's bias and masks come before its penalties, so one with any goes alone
    (rare: a penalty is the common case)."""
    processed: list[int] = []
    together: list[int] = []
    for i, (request, p) in enumerate(zip(requests, params, strict=True)):
        masked, penalised = _needs_bias_or_masks(request, p), needs_penalties(p)
        if masked or penalised or p.logits_processors:
            processed.append(i)
            if batched and penalised and not masked:
                together.append(i)
    return processed, together


def _apply_bias_and_masks(
    row: torch.Tensor, request: SamplingRequest, params: SamplingParams
) -> torch.Tensor:
    """Logit bias, allowed tokens, and stop tokens masked until ``min_tokens``."""
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
        # EOS is masked whatever ignore_eos says, as vLLM does: ignore_eos only keeps it from
        # ending the request
        if request.eos_token_id is not None:
            stop_ids.add(request.eos_token_id)
        if stop_ids:
            row = row.clone()
            row[torch.tensor(sorted(stop_ids), dtype=torch.long, device=row.device)] = float("-inf")
    return row


def _apply_logits_processors(
    row: torch.Tensor, request: SamplingRequest, params: SamplingParams
) -> torch.Tensor:
    for processor in params.logits_processors or ():
        try:
            row = processor(request.output_token_ids, row)
        except Exception as error:  # a faulty processor fails its own request, not the batch
            logger.exception("logits processor of request %s failed", request.request_id)
            request.error = error
    return row


def _no_nan(rows: torch.Tensor) -> torch.Tensor:
    # a NaN from a bias, penalty or processor is never the argmax of a greedy row
    return rows.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


def _apply_batch_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> None:
    """The penalties of ``meta.penalised_together`` in one pass, in place."""
    rows = meta.penalised_together
    index = torch.tensor(rows, device=logits.device)
    logits[index] = _no_nan(
        apply_penalties(
            logits[index],
            [meta.params[i] for i in rows],
            [meta.requests[i].prompt_token_ids for i in rows],
            [meta.requests[i].output_token_ids for i in rows],
        )
    )


def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Each processed row's bias and masks, penalties and logits processors, in that order (a
    copy of ``logits``). The rare per-request work goes row by row, but for the penalties of the
    rows in ``meta.penalised_together``, done together first."""
    logits = logits.clone()
    if meta.penalised_together:
        _apply_batch_penalties(logits, meta)
    together = set(meta.penalised_together)
    for i in meta.processed:
        request, params = meta.requests[i], meta.params[i]
        if i in together and not params.logits_processors:
            continue  # nothing left to do row by row
        row = _apply_bias_and_masks(logits[i], request, params)
        if i not in together and needs_penalties(params):
            row = _apply_penalties(row, request, params)
        logits[i] = _no_nan(_apply_logits_processors(row, request, params))
    return logits


def apply_grammar_bitmask(logits: torch.Tensor, grammar: GrammarBitmask) -> torch.Tensor:
    """Structured output, after every other processing: in each row of ``grammar.rows`` a token
    whose bit is clear becomes -inf (in place), as are tokens past the bitmask's vocabulary."""
    device, width = logits.device, logits.shape[-1]
    words = torch.from_numpy(grammar.bitmask).to(device)
    bits = (words[:, :, None] >> torch.arange(32, dtype=words.dtype, device=device)) & 1
    bits = bits.flatten(1)[:, :width].bool()
    allowed = torch.zeros(len(grammar.rows), width, dtype=torch.bool, device=device)
    allowed[:, : bits.shape[1]] = bits
    rows = torch.tensor(grammar.rows, device=device)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits


def _finite(rows: torch.Tensor) -> torch.Tensor:
    """Rows every later step can take, whatever the logits (in place): NaN counts as -inf, +inf
    tokens share the row, and a row with nothing left makes every token equally likely. Done with
    the extremes of the dtype, so a row always has a finite maximum and its weights a positive sum
    (a NaN or zero sum would draw a token id past the vocabulary)."""
    info = torch.finfo(rows.dtype)
    return rows.nan_to_num_(nan=info.min, posinf=info.max, neginf=info.min)


@dataclass
class FilterParams:
    """The filters' per-row values for a group of rows, as tensors on the logits' device; a
    filter no row of the group uses is None (and skipped)."""

    temperature: torch.Tensor  # [R, 1]
    min_p: torch.Tensor | None  # [R, 1]
    top_k: torch.Tensor | None  # [R]; the vocabulary size for a row without one
    max_top_k: int
    top_p: torch.Tensor | None  # [R, 1]: the top_p of rows with a top_k, among their k tokens
    nucleus: list[float]  # the top_p each row leaves to the draw (rows without a top_k)

    @classmethod
    def of(
        cls, params: Sequence[SamplingParams], vocab: int, dtype: torch.dtype, device: torch.device
    ) -> FilterParams:
        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)[:, None]

        has_top_k = [0 < p.top_k < vocab for p in params]
        top_k = [p.top_k if k else vocab for p, k in zip(params, has_top_k, strict=True)]
        # a row with top_k has its top_p applied among its k tokens; the others' at the draw
        top_p = [p.top_p if k else 1.0 for p, k in zip(params, has_top_k, strict=True)]
        min_p = [p.min_p for p in params]
        return cls(
            temperature=column([p.temperature for p in params]),
            min_p=column(min_p) if any(m > 0.0 for m in min_p) else None,
            top_k=torch.tensor(top_k, device=device) if any(has_top_k) else None,
            max_top_k=max(top_k, default=vocab),
            top_p=column(top_p) if min(top_p, default=1.0) < 1.0 else None,
            nucleus=[1.0 if k else p.top_p for p, k in zip(params, has_top_k, strict=True)],
        )


def apply_min_p(rows: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """A token less likely than ``min_p`` times its row's most likely one becomes -inf."""
    probs = torch.softmax(rows, dim=-1)
    return rows.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))


def apply_top_k_top_p(rows: torch.Tensor, filters: FilterParams) -> torch.Tensor:
    """Each row's ``top_k`` most likely tokens, then of those its nucleus ``top_p``; only the
    rows' top candidates are ordered (a row without top_k keeps them all here)."""
    assert filters.top_k is not None
    ordered, order = torch.topk(rows, filters.max_top_k, dim=-1)
    keep = torch.arange(ordered.shape[-1], device=rows.device)[None, :] < filters.top_k[:, None]
    ordered = ordered.masked_fill(~keep, float("-inf"))
    if filters.top_p is not None:
        probs = torch.softmax(ordered, dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) > filters.top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.full_like(rows, float("-inf")).scatter(1, order, ordered)


def filter_logits(
    logits: torch.Tensor, params: list[SamplingParams]
) -> tuple[torch.Tensor, list[float]]:
    """Temperature, min_p, top_k and top_p on rows of logits `[R, V]`, each row by its own
    parameters, all rows at once; filtered-out tokens become -inf. Returns the rows and the top_p
    each row still needs at the draw: a row with top_k has its top_p applied here, among its k
    candidates; a row without one leaves top_p to `Sampler` (no sort of the whole vocabulary)."""
    filters = FilterParams.of(params, logits.shape[-1], logits.dtype, logits.device)
    rows = _finite(logits / filters.temperature)
    if filters.min_p is not None:
        rows = apply_min_p(rows, filters.min_p)
    if filters.top_k is not None:
        rows = apply_top_k_top_p(rows, filters)
    return rows, filters.nucleus


def gather_logprobs(
    raw_logprobs: torch.Tensor, tokens: list[int], meta: SamplingMetadata, batched: bool
) -> list[TopLogprobs]:
    """The logprobs of each row of ``meta.logprobs``: all at once, or row by row."""
    chosen = [tokens[i] for i in meta.logprobs]
    if batched:
        rows = raw_logprobs[torch.tensor(meta.logprobs, device=raw_logprobs.device)]
        return top_logprobs(rows, chosen, meta.num_logprobs)
    return [
        _top_logprobs(raw_logprobs[i], token, k)
        for i, token, k in zip(meta.logprobs, chosen, meta.num_logprobs, strict=True)
    ]


class Sampler:
    def __init__(self, seed: int | None = None, batched: bool | None = None) -> None:
        """``batched``: penalties and logprobs for all rows at once (a GPU's way: no launch or
        copy per row), or row by row (a CPU's: each row stays in the caches, measured 1.5x
        faster there); None picks by the logits' device."""
        self.batched = batched
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()  # non-deterministic, without touching torch's global RNG
        else:
            self.generator.manual_seed(seed)

    def __call__(
        self,
        logits: torch.Tensor,
        requests: Sequence[SamplingRequest],
        grammar: GrammarBitmask | None = None,
        batch_processors: LogitsProcessorBatch | None = None,
    ) -> list[SampledToken]:
        """A token for each row of ``logits``; ``grammar``: structured output's allowed tokens
        of some rows (indexed as ``requests``); ``batch_processors``: the
        ``--logits-processors``, after every request's own processing."""
        logits = logits.float()
        batched = self.batched if self.batched is not None else logits.device.type != "cpu"
        meta = SamplingMetadata.from_requests(requests, batched)
        # logprobs are those of the model's own distribution, before any processing
        raw_logprobs = torch.log_softmax(logits, dim=-1) if meta.logprobs else None
        if meta.processed:
            logits = process_logits(logits, meta)
        if batch_processors is not None:
            logits = _no_nan(batch_processors.apply(logits, requests))  # type: ignore[arg-type]
        if grammar is not None:
            logits = apply_grammar_bitmask(logits, grammar)
        tokens = self._sample(logits, meta)
        results = [SampledToken(token) for token in tokens]
        if raw_logprobs is not None:
            found = gather_logprobs(raw_logprobs, tokens, meta, batched)
            for i, logprobs in zip(meta.logprobs, found, strict=True):
                results[i].logprobs = logprobs
        return results

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> list[int]:
        """A token per row: the argmax of the greedy rows, a draw from the filtered rows of the
        others."""
        if not meta.random:  # the common all-greedy batch: no row copy
            return logits.argmax(dim=-1).tolist()
        tokens = [0] * len(meta.params)
        if meta.greedy:
            greedy = logits[meta.greedy].argmax(dim=-1).tolist()
            for i, token in zip(meta.greedy, greedy, strict=True):
                tokens[i] = token
        for part in _row_groups(meta.random, logits):
            rows, nucleus = filter_logits(logits[part], [meta.params[i] for i in part])
            drawn = self._draw_in_nucleus(rows, [meta.requests[i] for i in part], nucleus)
            for i, token in zip(part, drawn, strict=True):
                tokens[i] = token
        return tokens

    def _draw_in_nucleus(
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


def prompt_logprobs(logits: torch.Tensor, next_tokens: list[int], k: int) -> list[TopLogprobs]:
    """Logprobs of ``next_tokens`` given the logits at the positions before them."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [_top_logprobs(logprobs[i], token, k) for i, token in enumerate(next_tokens)]
