"""Decode's linear on GGUF Q8_0/Q4_0/Q4_1 blocks (and Q6_K's groups of 16) with int8 activations
(kernels/cpu/int8_linear.c) gives llama.cpp's product: x quantized to int8 blocks of 32
(`reference.quantize_int8_blocks`), each block's integer dot product times both scales plus the
offset times the block's sum, within float32 summation of the float64 result; and the float64
product of the unquantized x within the int8 rounding's bound. Every path this CPU runs (AVX-512
VNNI, AVX2's maddubs, scalar loops), odd shapes, a strided x, bias, 1-4 rows; the engine's layers
take it only for GGUF's marked blocks and bfloat16 decode rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from infernetes.kernels import ops
from infernetes.kernels.cpu import group_quant, int8_linear, native
from infernetes.kernels.reference import group_quant as reference

from tests.kernels.test_kernels_cpu_group_quant import ISAS, _cpu_has, random_weight

# GGUF's types in group_quant's form (bits, offset, group): Q8_0 (int8, no offset), Q4_0 (offset
# -8 * scale), Q4_1, Q6_K (int8 in groups of 16), and a layer joining Q4_K and Q6_K parts (int8
# in groups of 16 with offsets: gguf_blocks.in_one_form)
KINDS = {
    "Q8_0": (8, False, 32),
    "Q4_0": (4, "minus 8", 32),
    "Q4_1": (4, True, 32),
    "Q6_K": (8, False, 16),
    "Q4_K+Q6_K": (8, True, 16),
}
TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}  # relative to the largest output


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


def gguf_weight(kind, outputs, inputs, seed=0):
    """qweight, scale, offset, bits, group."""
    bits, offset_kind, group = KINDS[kind]
    qweight, scale, offset = random_weight(outputs, inputs, group, bits, bool(offset_kind), seed)
    if offset_kind == "minus 8":
        offset = -8 * scale
    return qweight, scale, offset, bits, group


def int8_rounding_bound(x, weight):
    """Per output, the most x's int8 rounding can move it: half a block's scale per input
    times the weight's magnitude there."""
    _, x_scale = reference.quantize_int8_blocks(x)
    half_step = (x_scale / 2).repeat_interleave(32, dim=-1).double()
    return half_step @ weight.abs().T


@pytest.mark.parametrize("kind", list(KINDS))
# tiles of 4 rows and their tails; from 16, 8-bit weights on AMX where the CPU has it
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 16, "most"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "inputs", [96, 160, 4 * 128]
)  # 3, 5 and 16 blocks: steps of 2 and 4, tails
def test_matches_llama_cpp_product(kind, rows, dtype, inputs):
    qweight, scale, offset, bits, group = gguf_weight(kind, 37, inputs)  # an odd number of outputs
    rows = int8_linear.max_rows(bits) if rows == "most" else rows
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(rows, inputs, generator=gen) * 3).to(dtype)
    x[0, :32] = 0  # an all-zero block: scale 0
    bias = torch.randn(37, generator=gen).to(dtype)
    assert int8_linear.handles(x, qweight, scale, offset, bits, rows, group)
    out = int8_linear.linear(x, qweight, scale, offset, bits, bias, group)
    assert out.dtype == dtype and out.shape == (rows, 37)
    want = reference.int8_activation_linear(x.double(), qweight, scale, offset, bits, bias, group)
    assert ((out.double() - want).abs().max() / want.abs().max()) < TOL[dtype]
    weight = reference.dequantize(qweight, scale, offset, group, bits, torch.float64)
    exact = F.linear(x.double(), weight, bias.double())
    bound = int8_rounding_bound(x, weight) + TOL[dtype] * exact.abs().max()
    assert ((out.double() - exact).abs() <= bound).all()
    assert (out.double() - exact).abs().max() > 0  # x was rounded: not the float path


@pytest.mark.parametrize("kind", list(KINDS))
def test_strided_and_batched_x(kind):
    qweight, scale, offset, bits, group = gguf_weight(kind, 19, 128)
    wide = torch.randn(2, 2, 2 * 128).to(torch.bfloat16)
    x = wide[..., :128]  # rows 256 apart
    out = int8_linear.linear(x, qweight, scale, offset, bits, None, group)
    want = reference.int8_activation_linear(
        x.contiguous().double(), qweight, scale, offset, bits, None, group
    )
    assert out.shape == (2, 2, 19)
    assert ((out.double() - want).abs().max() / want.abs().max()) < TOL[torch.bfloat16]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("rows", [1, 3, 19])
@pytest.mark.parametrize("inputs", [96, 4 * 128])
def test_float16_scales_give_the_bits_of_their_float32_values(kind, rows, inputs):
    """GGUF's float16 scales and offsets, as the file stores them, are widened as they are
    read: the same bits as those values held in float32."""
    qweight, scale, offset, bits, group = gguf_weight(kind, 37, inputs, seed=5)
    half_scale = scale.half()
    half_offset = None if offset is None else (-8 * half_scale if kind == "Q4_0" else offset.half())
    x = torch.randn(rows, inputs).to(torch.bfloat16)
    bias = torch.randn(37).to(torch.bfloat16)
    assert int8_linear.handles(x, qweight, half_scale, half_offset, bits, rows, group)
    out = int8_linear.linear(x, qweight, half_scale, half_offset, bits, bias, group)
    wide_offset = None if half_offset is None else half_offset.float()
    wide = int8_linear.linear(x, qweight, half_scale.float(), wide_offset, bits, bias, group)
    assert torch.equal(out, wide)


@pytest.mark.parametrize("kind", list(KINDS))
def test_layers_take_it_only_for_marked_blocks_and_bf16_decode_rows(kind):
    qweight, scale, offset, bits, group = gguf_weight(kind, 40, 64)
    x = torch.randn(3, 64)
    bf16 = x.to(torch.bfloat16)
    llama = reference.int8_activation_linear(
        bf16.double(), qweight, scale, offset, bits, None, group
    )
    weight = reference.dequantize(qweight, scale, offset, group, bits, torch.float64)
    dense = F.linear(x.double(), weight)

    def run(x, int8_activations=True):
        out = ops.group_quant_linear(
            x, qweight, scale, offset, group, bits, int8_activations=int8_activations
        )
        return out.double()

    assert torch.allclose(run(bf16), llama, rtol=0, atol=8e-3 * llama.abs().max())
    int8 = int8_linear.linear(bf16, qweight, scale, offset, bits, None, group).double()
    assert torch.equal(run(bf16), int8)
    # float32 x, a weight not marked, prefill's many rows: float activations
    assert torch.allclose(run(x), dense, rtol=0, atol=1e-5 * dense.abs().max())
    assert not torch.equal(run(bf16, int8_activations=False), run(bf16))
    many = torch.randn(int8_linear.max_rows(bits) + 1, 64).to(torch.bfloat16)
    want = group_quant.group_quant_linear(many, qweight, scale, offset, group, bits).double()
    assert torch.equal(run(many), want)


def test_gguf_blocks_are_marked():
    from gguf import GGMLQuantizationType as Q
    from infernetes.runtime.model_executor.layers.quantization import gguf_blocks

    def weight(qtype):
        block_bytes = gguf_blocks.BLOCK_TYPES[qtype][0]
        raw = torch.randint(0, 256, (4, block_bytes * 8), dtype=torch.uint8)
        return gguf_blocks.group_quant_weight(raw.numpy(), qtype)

    assert all(weight(t).int8_activations for t in gguf_blocks.BLOCK_TYPES)
    assert weight(Q.Q6_K).group_size == 16 and weight(Q.Q6_K).bits == 8
