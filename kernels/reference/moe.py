"""Mixture of experts in torch: routing, then each token through its top-k experts.

The experts' weights of a layer are two stacked tensors, as vLLM lays them out: ``w13``
``[E, 2 * I, H]`` (each expert's gate and up projections, gate first) and ``w2`` ``[E, H, I]``
(its down projection); in fp8 with a scale per expert (``[E]``), per output channel (``[E, N]``)
or per ``bn x bk`` block (``[E, ceil(N / bn), ceil(K / bk)]``, block-wise checkpoints such as
DeepSeek-V3's). An expert computes ``down(silu(gate(x)) * up(x))``.
"""

from __future__ import annotations

import torch
from infernetes.kernels.reference.activation import silu_and_mul
from infernetes.kernels.reference.fp8 import FP8_DTYPES
from infernetes.kernels.reference.fp8_block import dequantize_block_fp8


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts, the ``top_k`` highest, optionally renormalised to sum to one:
    ``(weights [T, k] float32, ids [T, k] int32)``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def expert_weight(
    weights: torch.Tensor,
    scales: torch.Tensor | None,
    expert: int,
    dtype: torch.dtype,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Expert ``expert``'s ``[N, K]`` weight in ``dtype``, dequantised when stored in fp8."""
    weight = weights[expert]
    if weight.dtype not in FP8_DTYPES:
        return weight.to(dtype)
    if scales is None:
        raise ValueError("fp8 expert weights need their scales")
    if block is not None:
        return dequantize_block_fp8(weight, scales[expert], block, dtype)
    scale = scales[expert].float()
    scale = scale.reshape(-1, 1) if scale.numel() > 1 else scale
    return (weight.float() * scale).to(dtype)


def check_moe_shapes(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    experts, two_i, h = w13.shape
    if hidden.dim() != 2 or hidden.shape[1] != h:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not fit w13 {tuple(w13.shape)}")
    if tuple(w2.shape) != (experts, h, two_i // 2):
        raise ValueError(f"w2 {tuple(w2.shape)} does not fit w13 {tuple(w13.shape)}")
    check_routing(hidden, topk_weights, topk_ids)


def check_expert_scales(
    weights: torch.Tensor, scales: torch.Tensor | None, block: tuple[int, int] | None
) -> None:
    """fp8 experts' scales fit their weights ``[E, N, K]``: ``[E]``, ``[E, N]``, or with
    ``block`` ``[E, ceil(N / bn), ceil(K / bk)]``."""
    if weights.dtype not in FP8_DTYPES or scales is None:
        return
    experts, n, k = weights.shape
    allowed: list[tuple[int, ...]]
    if block is not None:
        allowed = [(experts, -(-n // block[0]), -(-k // block[1]))]
    else:
        allowed = [(experts,), (experts, n)]
    if tuple(scales.shape) not in allowed:
        raise ValueError(
            f"expert scales {tuple(scales.shape)} do not fit fp8 experts {(experts, n, k)}"
            + (f" in {block[0]}x{block[1]} blocks" if block else "")
            + f": expected {' or '.join(str(a) for a in allowed)}"
        )


def check_routing(hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be [{hidden.shape[0]}, top_k]"
        )


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden[t])`` -> ``[T, H]``; an id of
    -1 (an expert another rank holds, under expert parallelism) adds nothing.

    One pass per expert that has tokens: its tokens are gathered, go through the expert as two
    matmuls, and are added back weighted, in float32."""
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids)
    check_expert_scales(w13, w13_scale, block)
    check_expert_scales(w2, w2_scale, block)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for expert in topk_ids.unique().tolist():
        if expert < 0:
            continue
        tokens, slots = (topk_ids == expert).nonzero(as_tuple=True)
        x = hidden.index_select(0, tokens)
        gate_up = x @ expert_weight(w13, w13_scale, expert, hidden.dtype, block).T
        y = silu_and_mul(gate_up) @ expert_weight(w2, w2_scale, expert, hidden.dtype, block).T
        out.index_add_(0, tokens, y.float() * topk_weights[tokens, slots, None].float())
    return out.to(hidden.dtype)
