"""The block-wise fp8 weight-only GEMM against its torch reference (every weight dequantised by
its block's scale), and the reference against a loop over the blocks."""

import pytest
import torch

pytest.importorskip("triton")  # no Triton wheels outside Linux

from infernetes.kernels import ops
from infernetes.kernels import triton_backend as tk
from infernetes.kernels.reference import fp8_block

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _weight(n: int, k: int, block: tuple[int, int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) * 1e-3 + 1e-4
    return weight.to(DEVICE), scale_inv.to(DEVICE)


@pytest.mark.parametrize(
    "m,n,k,block,bias,dtype",
    [
        (1, 96, 256, (32, 32), False, torch.float32),  # decode: K split across programs
        (5, 200, 192, (64, 64), True, torch.float32),  # blocks cut by the edges
        (70, 128, 128, (128, 128), False, torch.float32),
        (3, 256, 512, (128, 128), True, torch.bfloat16),
    ],
)
def test_block_fp8_gemm_matches_the_reference(m, n, k, block, bias, dtype):
    weight, scale_inv = _weight(n, k, block, m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    b = torch.randn(n).to(DEVICE, dtype) if bias else None
    got = tk.block_fp8_linear(x, weight, scale_inv, block, b)
    want = fp8_block.block_fp8_linear(x, weight, scale_inv, block, b)
    tol = TOL[dtype] * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=TOL[dtype])


def test_the_reference_scales_each_block_by_its_own_scale():
    weight, scale_inv = _weight(70, 50, (32, 16), 0)
    dense = fp8_block.dequantize_block_fp8(weight, scale_inv, (32, 16), torch.float32)
    for i in range(70):
        for j in range(0, 50, 7):
            expected = float(weight[i, j].float()) * float(scale_inv[i // 32, j // 16])
            assert float(dense[i, j]) == pytest.approx(expected, rel=1e-6)


def test_scales_that_do_not_fit_are_refused():
    weight, scale_inv = _weight(64, 64, (32, 32), 0)
    with pytest.raises(ValueError, match="scale_inv"):
        ops.block_fp8_linear(torch.zeros(1, 64, device=DEVICE), weight, scale_inv, (64, 64))


@pytest.mark.parametrize("shape", [(96, 256), (3, 200, 70)])  # experts may lead; partial blocks
def test_quantize_block_fp8_is_undone_by_dequantize(shape):
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    block = (64, 32)
    fp8, scale_inv = fp8_block.quantize_block_fp8(weight, block)
    assert fp8.dtype == torch.float8_e4m3fn and fp8.shape == weight.shape
    assert scale_inv.shape == (*shape[:-2], -(-shape[-2] // 64), -(-shape[-1] // 32))
    back = torch.stack(
        [
            fp8_block.dequantize_block_fp8(w, s, block, torch.float32)
            for w, s in zip(
                fp8.reshape(-1, *shape[-2:]),
                scale_inv.reshape(-1, *scale_inv.shape[-2:]),
                strict=True,
            )
        ]
    ).reshape(shape)
    # e4m3 keeps 3 mantissa bits: within 1/16 of each value, or a step of the smallest numbers
    torch.testing.assert_close(back, weight, rtol=1 / 16, atol=float(scale_inv.max()))
