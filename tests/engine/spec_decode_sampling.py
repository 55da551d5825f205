"""Whether sampling with speculation draws from the target's distribution: many seeded samples
of a few tokens each, with and without drafts, and Pearson's chi-square test of homogeneity at
each verified position, of the token with the one before it (the pair, not the token alone: a
rule that keeps the wrong tokens may leave each position's mixture over its history nearly
unchanged). Vocabulary of a few hundred; pairs too rare for the test share one cell."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import torch

from infernetes import LLM, SamplingParams

NUM_SAMPLES = 500
MAX_TOKENS = 3  # output position 0 comes from the prefill step; 1 and 2 are verified ones
# the engines' settings: room for every sample at once
ROOMY = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=4096, block_size=8)


def homogeneity_p_value(first: Sequence[Hashable], second: Sequence[Hashable]) -> float:
    """The p-value that ``first`` and ``second`` are samples of one distribution; values with
    fewer than 5 expected in either sample share one cell."""
    counts = Counter(first), Counter(second)
    sizes = len(first), len(second)
    total = sum(sizes)
    cells: list[tuple[int, int]] = []
    rare = [0, 0]
    for value in counts[0].keys() | counts[1].keys():
        observed = counts[0][value], counts[1][value]
        if min(sum(observed) * n / total for n in sizes) < 5:
            rare = [rare[0] + observed[0], rare[1] + observed[1]]
        else:
            cells.append(observed)
    if sum(rare):
        cells.append((rare[0], rare[1]))
    statistic = 0.0
    for cell in cells:
        for observed, size in zip(cell, sizes, strict=True):
            expected = sum(cell) * size / total
            statistic += (observed - expected) ** 2 / expected
    degrees = len(cells) - 1
    if degrees < 1:
        return 1.0
    upper = torch.special.gammaincc(torch.tensor(degrees / 2), torch.tensor(statistic / 2))
    return float(upper)


def samples_by_position(
    llm: LLM, prompt: str | dict, first_seed: int
) -> list[list[tuple[int, int]]]:
    """Each output position's (previous token, token) over ``NUM_SAMPLES`` samples at
    temperature 1 seeded from ``first_seed`` on, from position 1 on."""
    params = [
        SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True, seed=seed)
        for seed in range(first_seed, first_seed + NUM_SAMPLES)
    ]
    outputs = llm.generate([prompt] * NUM_SAMPLES, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return [[(t[p - 1], t[p]) for t in tokens] for p in range(1, MAX_TOKENS)]


def verified_positions_p_values(
    plain: LLM, drafted: LLM, prompt: str | dict
) -> tuple[list[float], int]:
    """The p-values at the positions a draft can reach (1 and 2), and how many drafts
    ``drafted`` accepted. The samples are independent (other seeds): with the same seeds a
    correct rule draws the very same tokens."""
    without = samples_by_position(plain, prompt, 0)
    scheduler = drafted.llm_engine.engine_core.scheduler
    update = scheduler.update_from_output
    accepted = 0

    def counted(scheduler_output, model_output):
        nonlocal accepted
        updated, iteration = update(scheduler_output, model_output)
        accepted += iteration.num_accepted_tokens
        return updated, iteration

    scheduler.update_from_output = counted
    try:
        with_drafts = samples_by_position(drafted, prompt, NUM_SAMPLES)
    finally:
        del scheduler.update_from_output
    p_values = [homogeneity_p_value(a, b) for a, b in zip(without, with_drafts, strict=True)]
    return p_values, accepted
