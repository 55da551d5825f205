"""Decode's Q8_0 linear with int8 activations (kernels/cpu/int8_linear.c) gives llama.cpp's
product: x quantized to int8 blocks of 32 (`reference.quantize_int8_blocks`), each block's integer
dot product times both scales, within float32 summation of the float64 result; and the float64
product of the unquantized x within the int8 rounding's bound. Every path this CPU runs (AVX-512
VNNI, AVX2's maddubs, scalar loops), odd shapes, a strided x, bias, 1-8 rows; the engine's layers
take it only for Q8_0 weights and bfloat16 decode rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from infernetes.kernels import ops
from infernetes.kernels.cpu import group_quant, int8_linear, native
from infernetes.kernels.reference import group_quant as reference

from tests.kernels.test_kernels_cpu_group_quant import ISAS, _cpu_has


@pytest.fixture(autouse=True, params=list(ISAS))
def _needs_the_kernel(request, monkeypatch):
    isa = request.param
    if isa != "native" and not _cpu_has(ISAS[isa]):
        pytest.skip(f"this CPU cannot run the {isa} build")
    if isa != "native":
        monkeypatch.setenv(native.MARCH_ENV, isa)
    native.load.cache_clear()
    if native.load("int8_linear") is None:
        pytest.skip("no C compiler: the CPU path runs the torch reference")
    yield
    monkeypatch.undo()
    native.load.cache_clear()


def q8_0_weight(outputs, inputs, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-128, 128, (outputs, inputs), generator=gen, dtype=torch.int8)
    scale = torch.rand(outputs, inputs // 32, generator=gen) / 16 + 0.01
    return qweight, scale


def int8_rounding_bound(x, qweight, scale):
    """Per output, the most x's int8 rounding can move it: half a block's scale per input
    times the weight's magnitude there."""
    _, x_scale = reference.quantize_int8_blocks(x)
    half_step = (x_scale / 2).repeat_interleave(32, dim=-1).double()
    weight = reference.dequantize(qweight, scale, None, 32, 8, torch.float64)
    return half_step @ weight.abs().T


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inputs", [96, 4 * 128])  # an odd and an even number of blocks
def test_matches_llama_cpp_product(rows, dtype, inputs):
    qweight, scale = q8_0_weight(37, inputs)  # an odd number of outputs
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(rows, inputs, generator=gen) * 3).to(dtype)
    x[0, :32] = 0  # an all-zero block: scale 0
    bias = torch.randn(37, generator=gen).to(dtype)
    assert int8_linear.handles(x, qweight, scale, rows)
    out = int8_linear.linear(x, qweight, scale, bias)
    assert out.dtype == dtype and out.shape == (rows, 37)
    want = reference.int8_activation_linear(x.double(), qweight, scale, bias.double())
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3}[dtype]  # bf16: the output rounds once
    assert ((out.double() - want).abs().max() / want.abs().max()) < tol
    exact = F.linear(
        x.double(), reference.dequantize(qweight, scale, None, 32, 8, torch.float64), bias.double()
    )
    bound = int8_rounding_bound(x, qweight, scale) + tol * exact.abs().max()
    assert ((out.double() - exact).abs() <= bound).all()
    assert (out.double() - exact).abs().max() > 0  # x was rounded: not the float path


def test_strided_and_batched_x():
    qweight, scale = q8_0_weight(19, 128)
    wide = torch.randn(2, 3, 2 * 128).to(torch.bfloat16)
    x = wide[..., :128]  # rows 256 apart
    out = int8_linear.linear(x, qweight, scale, None)
    want = reference.int8_activation_linear(x.contiguous().double(), qweight, scale)
    assert out.shape == (2, 3, 19)
    assert ((out.double() - want).abs().max() / want.abs().max()) < 8e-3


def test_layers_take_it_only_for_q8_0_and_bf16_decode_rows():
    qweight, scale = q8_0_weight(40, 64)
    x = torch.randn(3, 64)
    llama = reference.int8_activation_linear(x.double(), qweight, scale)
    dense = F.linear(x.double(), reference.dequantize(qweight, scale, None, 32, 8, torch.float64))

    def run(x, int8_activations=True, offset=None):
        out = ops.group_quant_linear(
            x, qweight, scale, offset, 32, 8, int8_activations=int8_activations
        )
        return out.double()

    bf16 = x.to(torch.bfloat16)
    assert torch.allclose(run(bf16), llama, rtol=0, atol=8e-3 * llama.abs().max())
    assert torch.equal(run(bf16), int8_linear.linear(bf16, qweight, scale, None).double())
    # float32 x, a weight not marked Q8_0, an offset, prefill's many rows: float activations
    assert torch.allclose(run(x), dense, rtol=0, atol=1e-5 * dense.abs().max())
    assert not torch.equal(run(bf16, int8_activations=False), run(bf16))
    zero = torch.zeros_like(scale)
    assert not torch.equal(run(bf16, offset=zero), run(bf16))
    many = torch.randn(int8_linear.MAX_ROWS + 1, 64).to(torch.bfloat16)
    want = group_quant.group_quant_linear(many, qweight, scale, None, 32, 8).double()
    assert torch.equal(run(many), want)


def test_q8_0_blocks_are_marked():
    from gguf import GGMLQuantizationType as Q
    from infernetes.runtime.model_executor.layers.quantization import gguf_blocks

    raw = torch.randint(0, 256, (4, 2 * 34), dtype=torch.uint8)
    raw[:, 0:2] = raw[:, 34:36] = torch.tensor([0, 0x3C], dtype=torch.uint8)  # d = 1.0
    assert gguf_blocks.group_quant_weight(raw.numpy(), Q.Q8_0).int8_activations
    assert not gguf_blocks.group_quant_weight(
        torch.randint(0, 256, (4, 20), dtype=torch.uint8).numpy(), Q.Q4_1
    ).int8_activations
