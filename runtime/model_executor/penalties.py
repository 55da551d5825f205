"""Repetition, frequency and presence penalties for the rows of a batch at once (as vLLM's
``apply_penalties``): each row's generated tokens counted by one scatter, its prompt tokens
marked by another, then every row penalised by its own factors: one copy of the rows' token ids
to the device and a handful of kernels per step, whatever the number of rows. The sampler uses
it on a GPU; on a CPU a row at a time stays in the caches and is faster (``sampler.process_logits``).

Repetition (Hugging Face's ``RepetitionPenaltyLogitsProcessor``, CTRL's): a token seen in the
prompt or the output has a positive logit divided by the penalty, a negative one multiplied.
Frequency and presence (OpenAI's): ``logit - frequency * count - presence * (count > 0)`` over
the output's tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from infernetes.runtime.sampling_params import SamplingParams


def needs_penalties(params: SamplingParams) -> bool:
    return bool(
        params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
    )


def _counts(
    sequences: Sequence[Sequence[int]], like: torch.Tensor, count_past_vocab_as_last: bool
) -> torch.Tensor:
    """``[R, V]`` counts of each row's token ids, from one copy of the padded ids. An id past
    the vocabulary counts as the last token, or not at all."""
    vocab = like.shape[1]
    longest = max(1, max((len(s) for s in sequences), default=0))
    ids = np.full((len(sequences), longest), vocab - 1, dtype=np.int64)
    weights = np.zeros((len(sequences), longest), dtype=np.float32)
    for row, tokens in enumerate(sequences):
        ids[row, : len(tokens)] = tokens
        weights[row, : len(tokens)] = 1.0
    if not count_past_vocab_as_last:
        weights[ids >= vocab] = 0.0
    np.minimum(ids, vocab - 1, out=ids)
    counts = torch.zeros_like(like)
    counts.scatter_add_(
        1,
        torch.from_numpy(ids).to(like.device, non_blocking=True),
        torch.from_numpy(weights).to(like.device, like.dtype, non_blocking=True),
    )
    return counts


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> torch.Tensor:
    """``logits`` ``[R, V]`` penalised, row ``r`` by ``params[r]`` over its ``prompts[r]`` and
    ``outputs[r]`` token ids (as the row-by-row version: output ids past the vocabulary are
    not counted, prompt ids past it mark the last token)."""
    device, dtype = logits.device, logits.dtype

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)[:, None]

    counts = _counts(outputs, logits, count_past_vocab_as_last=False)
    repetition = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in repetition):
        seen = (_counts(prompts, logits, count_past_vocab_as_last=True) + counts) > 0
        factor = column(repetition)
        penalised = torch.where(logits > 0, logits / factor, logits * factor)
        logits = torch.where(seen, penalised, logits)
    frequency = [p.frequency_penalty for p in params]
    if any(frequency):
        logits = logits - column(frequency) * counts
    presence = [p.presence_penalty for p in params]
    if any(presence):
        logits = logits - column(presence) * (counts > 0).to(dtype)
    return logits
