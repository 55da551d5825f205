"""Decode's linear layers on GGUF blocks in groups of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
Q5_K: 8-bit or 4-bit codes) or of 16 (Q6_K's, 8-bit codes) with int8 activations, as llama.cpp
computes Q8_0/Q4_0/Q4_1, through the C kernel of int8_linear.c: each x row is quantized to int8
in blocks of 32 (one scale each, ``reference.quantize_int8_blocks``), and every block's product
with the weight's block is an integer dot product (AVX-512 VNNI / AVX2) times the two scales, plus the group's offset times
the sum of its x (a weight group of 16 takes half a block of x, with the block's scale).

The weight is read as 8- or 4-bit integers and never widened to float, so decode reads it at
close to the memory's rate; the activations lose what int8 rounding loses (at most half a block's
scale per element), which is llama.cpp's own trade on the same file. Many rows (prefill) stay on
group_quant's path (torch's GEMM on dequantized tiles), bound by arithmetic, not by the weight.
"""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import native

_DTYPE_CODES = native.dtype_codes(torch.float32, torch.bfloat16)
_QWEIGHT_DTYPES = {4: torch.uint8, 8: torch.int8}
BLOCK = 32  # GGUF's block: one weight scale and one activation scale per 32 inputs
HALF_BLOCK = 16  # Q6_K's group: two weight scales per activation block, 8-bit codes only
# decode batches up to 24 rows: there the float path (group_quant's kernel, then its dequantized
# tiles) took longer. Decode tok/s of a Qwen2.5-0.5B shape at batches 16 / 24 on an Intel Xeon's 2
# threads, float -> int8: Q8_0 103 -> 140 / 121 -> 142, Q4_1 106 -> 176 / 120 -> 192; at 32 rows
# the tiles won (Q8_0 170-180 against 150-157, Q4_1 even).
MAX_ROWS = 24
# 8-bit weights on Intel's tile unit (AMX, int8_linear.c's amx_linear), from 16 rows: Q8_0 decode
# at batch 32 208 tok/s against the float path's 175
MAX_TILE_ROWS = 32


def _library():
    return native.load("int8_linear")


def max_rows(bits: int) -> int:
    """The most x rows the kernel takes for weights of `bits`: more where the tiles take them."""
    library = _library()
    if library is None:
        return MAX_ROWS
    tiles = getattr(library, "_uses_tiles", None)  # asked once per build
    if tiles is None:
        tiles = library._uses_tiles = bool(library.int8_linear_tiles())
    return MAX_TILE_ROWS if bits == 8 and tiles else MAX_ROWS


def handles(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    bits: int,
    rows: int,
    group: int = BLOCK,
) -> bool:
    """Whether the kernel computes this layer: groups of 32 (int8 ``[N, K]`` or packed nibbles
    ``[N, K / 2]``) or of 16 (int8), float16 or float32 scales and offsets, float32 or bfloat16
    x of at most ``max_rows(bits)`` rows, and the kernel built."""
    inputs, groups = x.shape[-1], (qweight.shape[0], x.shape[-1] // group)
    return (
        (group == BLOCK or (group == HALF_BLOCK and bits == 8))
        and x.dtype in _DTYPE_CODES
        and qweight.dtype == _QWEIGHT_DTYPES.get(bits)
        and qweight.dim() == 2
        and qweight.shape[1] * 8 // bits == inputs
        and inputs % BLOCK == 0
        and tuple(scale.shape) == groups
        and native.takes_scales(scale, offset)
        and qweight.is_contiguous()
        and _library() is not None
        and 0 < rows <= max_rows(bits)
    )


def linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    bits: int,
    bias: torch.Tensor | None,
    group: int = BLOCK,
) -> torch.Tensor:
    """``x @ w.T + bias`` with ``w = q * scale + offset`` per group of `group` inputs and x
    quantized to int8 blocks of 32, for inputs `handles` accepts; `x` is ``[..., K]``."""
    rows_x = x.reshape(-1, x.shape[-1])
    if rows_x.stride(-1) != 1:
        rows_x = rows_x.contiguous()
    out = native.quantized_linear(
        _library().int8_linear, rows_x, qweight, scale, offset, bias, bits, group
    )
    return out.view(*x.shape[:-1], qweight.shape[0])
