"""Sampler: turn each request's logits into its next token, by that request's own parameters.

Order, as in vLLM v1: logprobs are taken from the raw logits; then logit bias, allowed tokens,
``min_tokens`` (stop tokens masked), penalties and logits processors; greedy rows take the argmax;
the others apply temperature, ``min_p``, ``top_k``, ``top_p`` and sample by the exponential race
(``argmax(p / q)``, ``q ~ Exp(1)``). A request with a ``seed`` draws ``q`` from its own generator, so
its tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from infernetes.runtime.engine.request import Request
from infernetes.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


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


def _apply_penalties(row: torch.Tensor, request: Request, params: SamplingParams) -> torch.Tensor:
    vocab = row.shape[-1]
    output = torch.tensor(request.output_token_ids, dtype=torch.long, device=row.device)
    output = output[output < vocab]
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[torch.tensor(request.prompt_token_ids, dtype=torch.long, device=row.device).clamp(max=vocab - 1)] = True
        seen[output] = True
        penalised = torch.where(row > 0, row / params.repetition_penalty, row * params.repetition_penalty)
        row = torch.where(seen, penalised, row)
    if params.frequency_penalty or params.presence_penalty:
        counts = torch.bincount(output, minlength=vocab).to(row.dtype)
        row = row - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(row.dtype)
    return row


def _process(row: torch.Tensor, request: Request) -> torch.Tensor:
    params = request.sampling_params
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
    if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
        row = _apply_penalties(row, request, params)
    for processor in params.logits_processors or ():
        try:
            row = processor(request.output_token_ids, row)
        except Exception as error:  # a faulty processor fails its own request, not the batch
            logger.exception("logits processor of request %s failed", request.request_id)
            request.error = error
    return row


def _filter(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, min_p, top_k and top_p on one row of logits."""
    row = row / params.temperature
    if params.min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row = row.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if 0 < params.top_k < row.shape[-1]:
        kth = torch.topk(row, params.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) > params.top_p
        row = row.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return row


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()  # non-deterministic, without touching torch's global RNG
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[SampledToken]:
        logits = logits.float()
        wants_logprobs = any(r.sampling_params.logprobs is not None for r in requests)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if wants_logprobs else None
        results: list[SampledToken] = []
        greedy_rows = [
            i for i, r in enumerate(requests)
            if r.sampling_params.greedy and not _needs_processing(r)
        ]
        if len(greedy_rows) == len(requests):  # the common all-greedy batch: no row copy
            greedy_tokens = logits.argmax(dim=-1).tolist()
        else:
            greedy_tokens = logits[greedy_rows].argmax(dim=-1).tolist() if greedy_rows else []
        greedy = dict(zip(greedy_rows, greedy_tokens, strict=True))
        for i, request in enumerate(requests):
            params = request.sampling_params
            if i in greedy:
                token = greedy[i]
            else:
                row = _process(logits[i], request)
                if params.greedy:
                    token = int(row.argmax())
                else:
                    token = self._sample(_filter(row, params), request)
            sampled = SampledToken(token)
            if params.logprobs is not None:
                sampled.logprobs = _top_logprobs(raw_logprobs[i], token, params.logprobs)
            results.append(sampled)
        return results

    def _sample(self, row: torch.Tensor, request: Request) -> int:
        probs = torch.softmax(row, dim=-1).cpu()
        generator = request.generator if request.generator is not None else self.generator
        q = torch.empty_like(probs).exponential_(generator=generator)
        return int((probs / q).argmax())


def _needs_processing(request: Request) -> bool:
    params = request.sampling_params
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
