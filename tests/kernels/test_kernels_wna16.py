"""The weight-only int4/int8 GEMM against its torch reference, and the packed layout against a
plain loop over the bits (a second unpacker that shares no code with the reference's)."""

import pytest
import torch

pytest.importorskip("triton")  # no Triton wheels outside Linux

from infernetes.kernels import triton_backend as tk
from infernetes.kernels.reference import wna16
from infernetes.kernels.triton_backend import wna16 as wna16_kernel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _random_layer(k: int, n: int, bits: int, group: int, reorder: bool, asym: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 2**bits, (k, n), generator=gen)
    groups = k // group
    scales = torch.rand(groups, n, generator=gen) * 0.02 + 0.001
    zeros = (
        torch.randint(0, 2**bits, (groups, n), generator=gen, dtype=torch.int32) if asym else None
    )
    g_idx = torch.arange(k, dtype=torch.int32) // group
    if reorder:  # desc_act: the features' groups follow an activation order, not their position
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    return values, scales, zeros, g_idx


def _bit_by_bit(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    words, n = qweight.shape
    pack = 32 // bits
    out = torch.zeros(words * pack, n, dtype=torch.int64)
    for w in range(words):
        for col in range(n):
            word = int(qweight[w, col]) & 0xFFFFFFFF
            for i in range(pack):
                out[w * pack + i, col] = (word >> (i * bits)) & (2**bits - 1)
    return out


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_matches_a_bit_by_bit_unpacker(bits):
    values, *_ = _random_layer(32, 6, bits, 32, False, False, 0)
    packed = wna16.pack_along_k(values, bits)
    assert packed.dtype == torch.int32 and packed.shape == (32 * bits // 32, 6)
    assert torch.equal(_bit_by_bit(packed, bits), values)
    assert torch.equal(wna16.unpack_along_k(packed, bits).long(), values)


@pytest.mark.parametrize(
    "bits,group,reorder,asym,dtype",
    [
        (4, 32, False, False, torch.float32),
        (4, 64, False, True, torch.float32),
        (4, 128, False, True, torch.float16),
        (4, 32, True, True, torch.float32),  # g_idx
        (8, 32, True, False, torch.float32),
        (8, 128, False, True, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("rows", [21, 1])  # one row: a decode step, split along K
def test_triton_wna16_linear_matches_reference(bits, group, reorder, asym, dtype, rows):
    k, n = 512, 80
    if rows == 1:  # the decode step really splits
        assert wna16_kernel.k_splits(rows, n, k, 64, 64) > 1
    values, scales, zeros, g_idx = _random_layer(k, n, bits, group, reorder, asym, bits + group)
    qweight = wna16.pack_along_k(values, bits).to(DEVICE)
    scales = scales.to(DEVICE, dtype)
    zeros = zeros.to(DEVICE) if zeros is not None else None
    g_idx = g_idx.to(DEVICE)
    x = torch.randn(rows, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    want = wna16.wna16_linear(x, qweight, scales, zeros, g_idx, bits, bias)
    got = tk.wna16_linear(x, qweight, scales, zeros, g_idx, bits, bias)
    assert got.shape == (rows, n) and got.dtype == dtype
    torch.testing.assert_close(got, want, atol=TOL[dtype] * 10, rtol=TOL[dtype])
    # The dequantised weight is the formula of the layout, written out once more by hand.
    zero = 2 ** (bits - 1) if zeros is None else zeros.cpu().long()[g_idx.cpu().long()]
    expected = ((values - zero) * scales.cpu().float()[g_idx.cpu().long()]).t()
    torch.testing.assert_close(
        wna16.dequantize_wna16(qweight, scales, zeros, g_idx, bits, torch.float32).cpu(),
        expected.float(),
    )
