"""DeepSeek's expert routing: which ``top_k`` experts a token goes to, and with what weight.

- DeepSeek-V2 (``topk_method`` ``greedy`` or ``group_limited_greedy``): a softmax over the
  experts; group-limited keeps only the ``topk_group`` groups (of ``n_group``) whose best expert
  scores highest, then takes the top-k of what is left.
- DeepSeek-V3 (``noaux_tc``): a sigmoid per expert; the choice adds each expert's
  ``e_score_correction_bias`` and keeps the ``topk_group`` groups whose two best biased scores sum
  highest, but the weights are the unbiased scores, renormalised when ``norm_topk_prob``.

Both multiply the weights by ``routed_scaling_factor``. Returns ``(weights [T, k] float32,
ids [T, k] int32)`` as `ops.fused_moe` takes them.
"""

from __future__ import annotations

import torch

TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _keep_groups(
    scores: torch.Tensor, group_scores: torch.Tensor, topk_group: int, fill: float
) -> torch.Tensor:
    """``scores`` ``[T, E]`` with every expert outside the ``topk_group`` best groups set to
    ``fill``; ``group_scores`` is ``[T, n_group]``."""
    num_tokens, n_group = group_scores.shape
    best = group_scores.topk(topk_group, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    keep = keep.unsqueeze(-1).expand(num_tokens, n_group, scores.shape[-1] // n_group)
    return scores.masked_fill(~keep.reshape_as(scores), fill)


def softmax_topk(
    router_logits: torch.Tensor,
    top_k: int,
    routed_scaling_factor: float,
    n_group: int | None = None,
    topk_group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2: greedy top-k of the softmax, group-limited when ``n_group`` is given."""
    scores = router_logits.float().softmax(dim=-1)
    if n_group and topk_group:
        group_scores = scores.view(scores.shape[0], n_group, -1).amax(dim=-1)
        scores = _keep_groups(scores, group_scores, topk_group, 0.0)
    weights, ids = scores.topk(top_k, dim=-1)
    return weights * routed_scaling_factor, ids.to(torch.int32)


def sigmoid_biased_group_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    routed_scaling_factor: float,
    n_group: int,
    topk_group: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 (``noaux_tc``): biased sigmoid scores choose, unbiased ones weigh."""
    scores = router_logits.float().sigmoid()
    choice = scores + correction_bias.float()
    group_scores = choice.view(choice.shape[0], n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
    choice = _keep_groups(choice, group_scores, topk_group, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)
