"""The fused MoE Triton kernel against its torch reference, and the reference against a plain
per-token loop (the definition, written the slow way)."""

import pytest
import torch

pytest.importorskip("triton")

from infernetes.kernels import triton_backend as tk
from infernetes.kernels.reference import moe
from infernetes.kernels.reference.fp8 import quantize_weight_fp8
from infernetes.kernels.reference.fp8_block import quantize_block_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _weights(experts, hidden, inter, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    return w13.to(DEVICE, dtype), w2.to(DEVICE, dtype)


def _by_token_loop(hidden, w13, w2, weights, ids):
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w13[e].double() @ hidden[t].double()).chunk(2)
            out[t] += weights[t, j].double() * (
                w2[e].double() @ (torch.nn.functional.silu(gate) * up)
            )
    return out


def _routing(tokens, experts, top_k, seed=0, skew=0.0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, 0] += skew  # skew > 0: most tokens pick expert 0 (an uneven load)
    return moe.select_experts(logits.to(DEVICE), top_k, renormalize=True)


def test_select_experts_matches_softmax_topk():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    weights, ids = moe.select_experts(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(weights, probs[:, [1, 2]])
    weights, _ = moe.select_experts(logits, 2, renormalize=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))


def test_reference_is_the_per_token_definition():
    hidden = torch.randn(7, 32, dtype=torch.float64).float()
    w13, w2 = _weights(6, 32, 16, torch.float32)
    weights, ids = _routing(7, 6, 2)
    got = moe.fused_moe(hidden.to(DEVICE), w13, w2, weights, ids)
    expected = _by_token_loop(hidden, w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu())
    torch.testing.assert_close(got.cpu().double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "hidden", "inter", "dtype", "skew"),
    [
        (5, 4, 1, 32, 16, torch.float32, 0.0),
        (9, 8, 2, 48, 24, torch.float32, 0.0),
        (3, 16, 8, 32, 32, torch.float32, 0.0),
        (20, 8, 2, 32, 16, torch.float32, 8.0),  # uneven: nearly every token on expert 0
        (2, 128, 8, 32, 16, torch.float32, 0.0),  # most of 128 experts get no token
        (70, 4, 2, 32, 16, torch.float32, 0.0),  # more rows than one block per expert
        (6, 8, 2, 32, 16, torch.float16, 0.0),
        (6, 8, 2, 32, 16, torch.bfloat16, 0.0),
    ],
)
def test_triton_fused_moe_matches_reference(tokens, experts, top_k, hidden, inter, dtype, skew):
    w13, w2 = _weights(experts, hidden, inter, dtype)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    weights, ids = _routing(tokens, experts, top_k, skew=skew)
    if skew:
        assert (ids == 0).any(dim=1).float().mean() > 0.9
    got = tk.fused_moe(x, w13, w2, weights, ids)
    expected = moe.fused_moe(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("per_channel", [False, True])
def test_triton_fused_moe_fp8_weights(per_channel):
    experts, hidden, inter = 4, 32, 16
    w13, w2 = _weights(experts, hidden, inter, torch.float32)

    def quantize(w):
        if per_channel:
            scale = (w.abs().amax(dim=2) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-6)
            return (w / scale[..., None]).to(torch.float8_e4m3fn), scale
        pairs = [quantize_weight_fp8(w[e]) for e in range(experts)]
        return torch.stack([q for q, _ in pairs]), torch.stack([s.reshape(()) for _, s in pairs])

    q13, s13 = quantize(w13)
    q2, s2 = quantize(w2)
    x = torch.randn(10, hidden, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    weights, ids = _routing(10, experts, 2)
    got = tk.fused_moe(x, q13, q2, weights, ids, s13, s2)
    expected = moe.fused_moe(x, q13, q2, weights, ids, s13, s2)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # and the fp8 result is close to the unquantised one
    exact = moe.fused_moe(x, w13, w2, weights, ids)
    assert (got - exact).abs().max() < 0.1 * exact.abs().max()


@pytest.mark.parametrize(
    ("hidden", "inter", "block"),
    [
        (64, 32, (16, 16)),  # several blocks in one 64-wide tile
        (48, 24, (16, 32)),  # the last block of each dimension partial
        (128, 64, (128, 128)),  # DeepSeek-V3's blocks, one per expert's down projection
    ],
)
def test_triton_fused_moe_block_fp8_weights(hidden, inter, block):
    """Block-wise fp8 experts (a scale per bn x bk block of each expert): the GEMMs scale each
    tile's elements by their block's scale and match the dequantising reference."""
    experts = 4
    w13, w2 = _weights(experts, hidden, inter, torch.float32)

    q13, s13 = quantize_block_fp8(w13, block)
    q2, s2 = quantize_block_fp8(w2, block)
    x = torch.randn(10, hidden, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    weights, ids = _routing(10, experts, 2)
    got = tk.fused_moe(x, q13, q2, weights, ids, s13, s2, block)
    expected = moe.fused_moe(x, q13, q2, weights, ids, s13, s2, block)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    exact = moe.fused_moe(x, w13, w2, weights, ids)
    assert (got - exact).abs().max() < 0.1 * exact.abs().max()
    # the scales are per block: read as per-expert ones they give another result
    with pytest.raises(ValueError, match=r"expert scales .* do not fit fp8 experts"):
        tk.fused_moe(x, q13, q2, weights, ids, s13, s2)


def test_ids_of_minus_one_add_nothing():
    """Expert parallelism: experts another rank holds come as -1 and are skipped."""
    w13, w2 = _weights(4, 32, 16, torch.float32)
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    weights, ids = _routing(9, 8, 2)  # 8 experts routed, this rank holds 4..7
    local = torch.where(ids >= 4, ids - 4, -1).to(torch.int32)
    assert (local == -1).any() and (local >= 0).any()
    kept = torch.where(local >= 0, weights, 0.0)
    expected = moe.fused_moe(x, w13, w2, kept, torch.where(local >= 0, local, 0).to(torch.int32))
    torch.testing.assert_close(moe.fused_moe(x, w13, w2, weights, local), expected)
    torch.testing.assert_close(
        tk.fused_moe(x, w13, w2, weights, local), expected, atol=1e-4, rtol=1e-4
    )


def test_sort_rows_by_expert_groups_and_pads():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], dtype=torch.int32, device=DEVICE)
    rows, blocks = tk.moe.sort_rows_by_expert(ids, num_experts=4, block_m=2)
    rows, blocks = rows.tolist(), blocks.tolist()
    pad = ids.numel()
    # expert 0: rows 1, 4; expert 1: row 3 (+pad); expert 2: rows 0, 2, 5 (+pad); expert 3: none
    assert rows[:8] == [1, 4, 3, pad, 0, 2, 5, pad]
    assert blocks[:4] == [0, 1, 2, 2] and set(blocks[4:]) <= {-1}
    assert all(r == pad for r in rows[8:])


def test_shapes_that_do_not_fit_are_refused():
    w13, w2 = _weights(4, 32, 16, torch.float32)
    weights, ids = _routing(3, 4, 2)
    with pytest.raises(ValueError, match="does not fit"):
        moe.fused_moe(torch.randn(3, 48, device=DEVICE), w13, w2, weights, ids)
