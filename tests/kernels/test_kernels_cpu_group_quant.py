"""The CPU path's group-quantized linear (kernels/cpu/group_quant.c) gives the float64 product of
x and the dequantized weight: 4- and 8-bit weights, every group size the kernel takes, with and
without offsets and bias, float32 and bfloat16 activations, a strided x, few rows (the kernel) and
many (torch's GEMM on the tiles the kernel dequantizes). The errors allowed are far below what a
wrong nibble, group or offset gives."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from infernetes.kernels import ops
from infernetes.kernels.cpu import group_quant as cpu
from infernetes.kernels.cpu import native
from infernetes.kernels.reference import group_quant as reference

# relative to the largest output: float32 sums in another order; bfloat16 rounds the output once
TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


# The paths of group_quant.c: this CPU's own (AVX-512 with the bf16 dot product here), AVX-512
# without it, AVX2, and the scalar loops, each built with its -march and run where the CPU can.
ISAS = {"native": None, "x86-64-v4": "avx512bw", "x86-64-v3": "avx2", "x86-64": None}


def _cpu_has(flag: str | None) -> bool:
    if flag is None:
        return True
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.fixture(autouse=True, params=list(ISAS))
def _needs_the_kernel(request, monkeypatch):
    isa = request.param
    if isa != "native" and (platform.machine() != "x86_64" or not _cpu_has(ISAS[isa])):
        pytest.skip(f"this CPU cannot run the {isa} build")
    if isa != "native":
        monkeypatch.setenv(native.MARCH_ENV, isa)
    native.load.cache_clear()
    if native.load("group_quant") is None:
        pytest.skip("no C compiler: the CPU path runs the torch reference")
    yield
    monkeypatch.undo()
    native.load.cache_clear()


def random_weight(outputs, inputs, group, bits, with_offset, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if bits == 4:
        qweight = torch.randint(0, 256, (outputs, inputs // 2), generator=gen, dtype=torch.uint8)
    else:
        qweight = torch.randint(-128, 128, (outputs, inputs), generator=gen, dtype=torch.int8)
    scale = torch.rand(outputs, inputs // group, generator=gen) / 16 + 0.01
    offset = torch.randn(outputs, inputs // group, generator=gen) if with_offset else None
    return qweight, scale, offset


def expected(x, qweight, scale, offset, group, bits, bias):
    weight = reference.dequantize(qweight, scale, offset, group, bits, torch.float64)
    return F.linear(x.double(), weight, None if bias is None else bias.double())


def assert_close(out, want, dtype):
    assert out.dtype == dtype
    error = (out.double() - want).abs().max() / want.abs().max()
    assert error < TOL[dtype]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [16, 32, 64, 128])
@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_dequantized_product(bits, group, rows, dtype):
    outputs, inputs = 37, 3 * 128  # an odd number of outputs; 384 inputs: not 512-bit aligned rows
    qweight, scale, offset = random_weight(outputs, inputs, group, bits, with_offset=True)
    x = torch.randn(rows, inputs).to(dtype)
    out = ops.group_quant_linear(x, qweight, scale, offset, group, bits)
    assert_close(out, expected(x, qweight, scale, offset, group, bits, None), dtype)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [2, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_offset_with_bias_and_a_strided_batch(bits, rows, dtype):
    outputs, inputs, group = 24, 48, 16  # 48 inputs: not a multiple of 32 (a bf16 vector)
    qweight, scale, _ = random_weight(outputs, inputs, group, bits, with_offset=False, seed=1)
    bias = torch.randn(outputs).to(dtype)
    wide = torch.randn(2, rows, inputs + 8).to(dtype)
    x = wide[..., 4 : 4 + inputs]  # rows with a stride of their own, batched as [2, rows, K]
    out = ops.group_quant_linear(x, qweight, scale, None, group, bits, bias)
    assert out.shape == (2, rows, outputs)
    want = expected(x.reshape(-1, inputs), qweight, scale, None, group, bits, bias)
    assert_close(out.reshape(-1, outputs), want, dtype)


@pytest.mark.parametrize("with_offset", [True, False])
@pytest.mark.parametrize("group, inputs", [(32, 160), (32, 96), (64, 192), (96, 288)])
def test_one_bfloat16_row_on_4_bit_groups_of_32s(group, inputs, with_offset):
    """Decode's 4-bit path (nibbles as bf16 of 128 + n, two groups per step): an odd number of
    32-input groups leaves a last group alone; groups of 96 straddle the steps; bias added."""
    qweight, scale, offset = random_weight(19, inputs, group, 4, with_offset, seed=10)
    bias = torch.randn(19).bfloat16()
    x = torch.randn(1, inputs).bfloat16()
    out = ops.group_quant_linear(x, qweight, scale, offset, group, 4, bias)
    assert_close(out, expected(x, qweight, scale, offset, group, 4, bias), torch.bfloat16)


def test_a_wrong_nibble_order_would_fail():
    """The tolerance catches the mistakes it is there for: swapping the nibbles of the weight
    (inputs 2j and 2j + 1 exchanged) changes the product far beyond it."""
    qweight, scale, offset = random_weight(16, 64, 32, 4, with_offset=True, seed=2)
    x = torch.randn(1, 64)
    swapped = (qweight >> 4) | (qweight << 4)
    out = ops.group_quant_linear(x, swapped, scale, offset, 32, 4)
    want = expected(x, qweight, scale, offset, 32, 4, None)
    assert (out.double() - want).abs().max() / want.abs().max() > 100 * TOL[torch.float32]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_gives_the_reference_weight(bits, dtype):
    qweight, scale, offset = random_weight(40, 256, 32, bits, with_offset=True, seed=3)
    rows = cpu.dequantize(qweight, scale, offset, 32, bits, dtype, 8, 30)
    want = reference.dequantize(qweight, scale, offset, 32, bits, torch.float64)[8:30]
    # the kernel fuses q * scale + offset into one rounding
    torch.testing.assert_close(rows.double(), want.to(dtype).double(), rtol=8e-3, atol=1e-6)


def test_groups_the_kernel_does_not_take_go_to_the_reference():
    qweight, scale, offset = random_weight(8, 48, 24, 8, with_offset=True, seed=4)
    assert not cpu.handles(24, 48)
    x = torch.randn(2, 48)
    out = ops.group_quant_linear(x, qweight, scale, offset, 24, 8)
    assert_close(out, expected(x, qweight, scale, offset, 24, 8, None), torch.float32)


def test_kernels_off_runs_the_reference(monkeypatch):
    monkeypatch.setenv(native.ENABLE_ENV, "0")
    native.load.cache_clear()
    try:
        qweight, scale, offset = random_weight(8, 64, 32, 4, with_offset=True, seed=5)
        x = torch.randn(1, 64)
        out = ops.group_quant_linear(x, qweight, scale, offset, 32, 4)
        want = reference.group_quant_linear(x, qweight, scale, offset, 32, 4)
        assert torch.equal(out, want)
    finally:
        monkeypatch.delenv(native.ENABLE_ENV)
        native.load.cache_clear()


def test_shares_torchs_openmp_runtime():
    """The kernel's libgomp.so.1 is the copy torch loaded: one thread pool, not two. (Wheels
    that vendor their own under a mangled name, e.g. scikit-learn's libgomp-<hash>.so, run
    theirs apart and are not the kernel's.)"""
    assert native.load("group_quant") is not None
    maps = Path("/proc/self/maps").read_text()
    libraries = {
        line.split()[-1]
        for line in maps.splitlines()
        if Path(line.split()[-1]).name.startswith("libgomp.so")
    }
    assert len(libraries) == 1, libraries


def test_no_rows_and_a_wrongly_typed_weight():
    qweight, scale, offset = random_weight(8, 64, 32, 8, with_offset=True, seed=6)
    assert ops.group_quant_linear(torch.empty(0, 64), qweight, scale, offset, 32, 8).shape == (0, 8)
    # 8-bit integers stored unsigned are not what the kernel reads: the reference takes them
    unsigned = qweight.view(torch.uint8)
    x = torch.randn(1, 64)
    out = ops.group_quant_linear(x, unsigned, scale, offset, 32, 8)
    assert torch.equal(out, reference.group_quant_linear(x, unsigned, scale, offset, 32, 8))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [16, 32, 64])
@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float16_scales_give_the_bits_of_their_float32_values(bits, group, rows, dtype):
    """Scales and offsets in float16 (GGUF's blocks keep them as the file does) are widened as
    they are read: every path (one row, a few, the dequantized tiles) gives the same bits as
    the same values held in float32."""
    qweight, scale, offset = random_weight(37, 3 * 128, group, bits, with_offset=True, seed=7)
    half_scale, half_offset = scale.half(), offset.half()
    x = torch.randn(rows, 3 * 128).to(dtype)
    bias = torch.randn(37).to(dtype)
    out = ops.group_quant_linear(x, qweight, half_scale, half_offset, group, bits, bias)
    wide = ops.group_quant_linear(
        x, qweight, half_scale.float(), half_offset.float(), group, bits, bias
    )
    assert torch.equal(out, wide)
    assert_close(out, expected(x, qweight, half_scale, half_offset, group, bits, bias), dtype)
    rows_f16 = cpu.dequantize(qweight, half_scale, half_offset, group, bits, dtype, 3, 30)
    rows_f32 = cpu.dequantize(
        qweight, half_scale.float(), half_offset.float(), group, bits, dtype, 3, 30
    )
    assert torch.equal(rows_f16, rows_f32)


def test_scales_of_mixed_or_other_dtypes_go_to_the_reference():
    qweight, scale, offset = random_weight(8, 64, 32, 4, with_offset=True, seed=8)
    x = torch.randn(1, 64)
    for pair in ((scale.half(), offset), (scale.double(), offset.double())):
        assert not native.takes_scales(*pair)
        out = ops.group_quant_linear(x, qweight, *pair, 32, 4)
        assert torch.equal(out, reference.group_quant_linear(x, qweight, *pair, 32, 4))
