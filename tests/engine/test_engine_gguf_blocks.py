"""Each GGUF block type held as a GroupQuantWeight dequantises to the ``gguf`` package's reference
values, bit for bit in float32, on random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from infernetes.runtime import testing_gguf
from infernetes.runtime.model_executor.layers.quantization.gguf_blocks import (
    BLOCK_TYPES,
    group_quant_weight,
)

ROWS = 6


def random_blocks(qtype: Q, blocks_per_row: int, seed: int) -> np.ndarray:
    return testing_gguf.random_blocks(qtype, ROWS, blocks_per_row, np.random.default_rng(seed))


@pytest.mark.parametrize("qtype", list(BLOCK_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_blocks_match_gguf_reference(qtype: Q, seed: int) -> None:
    raw = random_blocks(qtype, blocks_per_row=3, seed=seed)
    weight = group_quant_weight(raw, qtype)
    expected = dequantize(raw, qtype)
    assert weight.dequantize(torch.float32).shape == expected.shape
    assert np.array_equal(weight.dequantize(torch.float32).numpy(), expected)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1], ids=lambda t: t.name)
def test_quantized_by_gguf_match_its_reference(qtype: Q) -> None:
    """Weights quantized by the package itself (it quantizes these types)."""
    values = np.random.default_rng(3).standard_normal((8, 128)).astype(np.float32)
    raw = quantize(values, qtype)
    weight = group_quant_weight(raw, qtype)
    assert np.array_equal(weight.dequantize(torch.float32).numpy(), dequantize(raw, qtype))
    assert weight.bits == (4 if qtype in (Q.Q4_0, Q.Q4_1) else 8)


def test_k_quant_layout() -> None:
    """The group sizes and bit widths the CPU kernels see."""
    layouts = {
        qtype: (w.group_size, w.bits, w.offset is not None)
        for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K)
        for w in [group_quant_weight(random_blocks(qtype, 1, 0), qtype)]
    }
    assert layouts == {Q.Q4_K: (32, 4, True), Q.Q5_K: (32, 8, True), Q.Q6_K: (16, 8, False)}


def test_scales_stay_float16_where_it_holds_them() -> None:
    """Q8_0's, Q4_0's and Q4_1's scales and offsets stay float16 as the file stores them (a Q4_1
    block held in the file's 20 bytes, not 24 with float32 ones); the K-quants' products need
    float32; a Q4_0 scale whose ``-8 * d`` overflows float16 keeps its tensor in float32, exact."""
    dtypes = {
        qtype: group_quant_weight(random_blocks(qtype, 2, 0), qtype).scale.dtype
        for qtype in BLOCK_TYPES
    }
    assert dtypes == {
        Q.Q8_0: torch.float16,
        Q.Q4_0: torch.float16,
        Q.Q4_1: torch.float16,
        Q.Q5_0: torch.float16,
        Q.Q5_1: torch.float16,
        Q.Q4_K: torch.float32,
        Q.Q5_K: torch.float32,
        Q.Q6_K: torch.float32,
    }
    q4_1 = group_quant_weight(random_blocks(Q.Q4_1, 2, 0), Q.Q4_1)
    assert q4_1.offset is not None and q4_1.offset.dtype == torch.float16
    raw = random_blocks(Q.Q4_0, 2, 1)
    raw[0, 0:2] = np.frombuffer(np.float16(10000.0).tobytes(), dtype=np.uint8)  # -8 d: -80000
    weight = group_quant_weight(raw, Q.Q4_0)
    assert weight.scale.dtype == torch.float32 and weight.offset is not None
    assert weight.offset[0, 0] == -80000.0
    assert np.array_equal(weight.dequantize(torch.float32).numpy(), dequantize(raw, Q.Q4_0))
