"""The mixture-of-experts GEMMs over 4- and 8-bit packed experts against their torch reference
(every expert dequantised, then the dense MoE reference): top-k 1/2/8, 4 to 64 experts, uneven
and empty experts, another rank's experts (id -1), groups reordered per expert (GPTQ's desc_act),
symmetric and not; and the reference against each expert's dequantised weight multiplied alone."""

import pytest
import torch

pytest.importorskip("triton")  # no Triton wheels outside Linux

from infernetes.kernels import triton_backend as tk
from infernetes.kernels.reference import wna16
from infernetes.kernels.reference.wna16 import PackedExperts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _experts(e: int, k: int, n: int, bits: int, group: int, asym: bool, reorder: bool, gen):
    words, scales, zeros, g_idx = [], [], [], []
    for _ in range(e):
        values = torch.randint(0, 2**bits, (k, n), generator=gen)
        words.append(wna16.pack_along_k(values, bits))
        scales.append(torch.rand(k // group, n, generator=gen) * 0.02 + 0.001)
        zeros.append(torch.randint(0, 2**bits, (k // group, n), generator=gen, dtype=torch.int32))
        order = torch.arange(k, dtype=torch.int32) // group
        g_idx.append(order[torch.randperm(k, generator=gen)] if reorder else order)
    return PackedExperts(
        torch.stack(words).to(DEVICE),
        torch.stack(scales).to(DEVICE),
        torch.stack(zeros).to(DEVICE) if asym else None,
        torch.stack(g_idx).to(DEVICE),
        bits,
    )


def _routing(tokens: int, experts: int, top_k: int, skew: bool, gen):
    logits = torch.randn(tokens, experts, generator=gen)
    if skew:  # most tokens to the first experts, the last ones empty
        logits[:, : max(1, experts // 4)] += 4.0
        logits[:, -1] = -1e9
    weights, ids = torch.softmax(logits, -1).topk(top_k, dim=-1)
    return weights.to(DEVICE), ids.to(torch.int32).to(DEVICE)


@pytest.mark.parametrize(
    "bits,group,asym,reorder,experts,top_k,tokens,skew,dtype",
    [
        (4, 32, False, False, 4, 2, 5, False, torch.float32),
        (4, 32, True, True, 8, 2, 40, True, torch.float32),
        (8, 64, True, False, 16, 1, 33, True, torch.float32),
        (4, 64, False, True, 64, 8, 20, False, torch.float32),
        (4, 32, True, False, 8, 2, 300, False, torch.bfloat16),  # long blocks of rows
    ],
)
def test_packed_experts_match_the_reference(
    bits, group, asym, reorder, experts, top_k, tokens, skew, dtype
):
    gen = torch.Generator().manual_seed(experts * 7 + tokens)
    hidden_size, intermediate = 64, 64
    w13 = _experts(experts, hidden_size, 2 * intermediate, bits, group, asym, reorder, gen)
    w2 = _experts(experts, intermediate, hidden_size, bits, group, asym, reorder, gen)
    hidden = torch.randn(tokens, hidden_size, generator=gen).to(DEVICE, dtype)
    weights, ids = _routing(tokens, experts, top_k, skew, gen)
    got = tk.fused_moe_wna16(hidden, w13, w2, weights, ids)
    want = wna16.fused_moe_wna16(hidden, w13, w2, weights, ids)
    tol = TOL[dtype] * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=TOL[dtype])


def test_experts_of_another_rank_add_nothing():
    gen = torch.Generator().manual_seed(3)
    w13 = _experts(4, 64, 64, 4, 32, True, False, gen)
    w2 = _experts(4, 32, 64, 4, 32, True, False, gen)
    hidden = torch.randn(6, 64, generator=gen).to(DEVICE)
    weights, ids = _routing(6, 4, 2, False, gen)
    ids[:, 1] = -1  # every token's second expert is held elsewhere
    got = tk.fused_moe_wna16(hidden, w13, w2, weights, ids)
    only_first = wna16.fused_moe_wna16(hidden, w13, w2, weights[:, :1], ids[:, :1])
    torch.testing.assert_close(got, only_first, atol=1e-4, rtol=1e-4)


def test_the_reference_is_each_expert_alone():
    """Token by token: the routed experts' ``down(silu(gate(x)) * up(x))`` on each expert's own
    dequantised weight, weighted and summed."""
    gen = torch.Generator().manual_seed(5)
    w13 = _experts(4, 64, 64, 4, 32, True, True, gen)
    w2 = _experts(4, 32, 64, 8, 32, False, False, gen)
    hidden = torch.randn(3, 64, generator=gen).to(DEVICE)
    weights, ids = _routing(3, 4, 2, False, gen)
    got = wna16.fused_moe_wna16(hidden, w13, w2, weights, ids)
    for t in range(3):
        total = torch.zeros(64, device=DEVICE)
        for j in range(2):
            e = int(ids[t, j])
            gate_up = wna16.dequantize_wna16(
                w13.qweight[e], w13.scales[e], w13.zeros[e], w13.g_idx[e], 4, torch.float32
            )
            down = wna16.dequantize_wna16(
                w2.qweight[e], w2.scales[e], None, w2.g_idx[e], 8, torch.float32
            )
            gate, up = (gate_up @ hidden[t]).chunk(2)
            total += weights[t, j] * (down @ (torch.nn.functional.silu(gate) * up))
        torch.testing.assert_close(got[t], total, atol=1e-4, rtol=1e-4)


def test_shapes_that_do_not_fit_are_refused():
    from infernetes.kernels import ops

    gen = torch.Generator().manual_seed(0)
    w13 = _experts(2, 64, 64, 4, 32, False, False, gen)
    w2 = _experts(2, 64, 64, 4, 32, False, False, gen)  # 64 inputs, the intermediate is 32
    weights, ids = _routing(2, 2, 1, False, gen)
    with pytest.raises(ValueError, match="w2"):
        ops.fused_moe_wna16(torch.zeros(2, 64, device=DEVICE), w13, w2, weights, ids)
