"""Decode's linear layers on GGUF Q8_0 weights with int8 activations, as llama.cpp computes them,
through the C kernel of int8_linear.c: each x row is quantized to int8 in blocks of 32 (one scale
each, ``reference.quantize_int8_blocks``), and every block's product with the weight's block is
an integer dot product (AVX-512 VNNI / AVX2) times the two scales.

The weight is read as int8 and never widened, so decode reads the 8-bit weight at close to the
memory's rate; the activations lose what int8 rounding loses (a block's error at most half its
scale per element), which is llama.cpp's own trade on the same file. Many rows (prefill) stay on
group_quant's path (bf16/f32 activations, torch's GEMM on dequantized tiles), where the product is
bound by arithmetic, not by reading the weight.
"""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import native

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
BLOCK = 32  # Q8_0's block: one weight scale and one activation scale per 32 inputs
MAX_ROWS = 8  # decode batches (as skinny_linear's); more rows go to group_quant's tiled GEMM


def _library():
    return native.load("int8_linear")


def handles(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, rows: int) -> bool:
    """Whether the kernel computes this layer: Q8_0's form (int8 ``[N, K]``, one float32 scale
    per 32 inputs, no offset), float32 or bfloat16 x of at most ``MAX_ROWS`` rows, and the
    kernel built."""
    inputs = x.shape[-1]
    return (
        x.dtype in _DTYPE_CODES
        and qweight.dtype == torch.int8
        and qweight.dim() == 2
        and qweight.shape[1] == inputs
        and inputs % BLOCK == 0
        and scale.dtype == torch.float32
        and tuple(scale.shape) == (qweight.shape[0], inputs // BLOCK)
        and qweight.is_contiguous()
        and scale.is_contiguous()
        and 0 < rows <= MAX_ROWS
        and _library() is not None
    )


def linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ w.T + bias`` with ``w = qweight * scale`` per block of 32 and x quantized to int8
    blocks, for inputs `handles` accepts; `x` is ``[..., K]``."""
    rows_x = x.reshape(-1, x.shape[-1])
    if rows_x.stride(-1) != 1:
        rows_x = rows_x.contiguous()
    rows, outputs = rows_x.shape[0], qweight.shape[0]
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    out = torch.empty((rows, outputs), dtype=x.dtype)
    status = _library().int8_linear(
        rows_x.data_ptr(),
        rows_x.stride(0),
        _DTYPE_CODES[x.dtype],
        out.data_ptr(),
        out.stride(0),
        qweight.data_ptr(),
        scale.data_ptr(),
        bias.data_ptr() if bias is not None else None,
        rows,
        outputs,
        qweight.shape[1],
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("int8_linear: the CPU kernel could not allocate its scratch")
    return out.view(*x.shape[:-1], outputs)
