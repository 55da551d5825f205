"""Linear layers on group-quantized weights on the CPU through the C kernels of group_quant.c.

Few rows (decode): the kernel reads each packed weight row once for all rows, so a step reads the
4- or 8-bit weights, not a dense copy. Many rows (prefill): the product is bound by arithmetic,
not by the weight, so tiles of weight rows are dequantized by the C kernel into a scratch buffer
and multiplied by torch's GEMM. Same contract as `infernetes.kernels.ops.group_quant_linear`;
the torch reference runs whenever the kernels are unavailable or the tensors are outside what
they handle."""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import int8_linear, native, packed_linear
from infernetes.kernels.reference import group_quant as reference

_DTYPE_CODES = native.dtype_codes(torch.float32, torch.bfloat16)
_QWEIGHT_DTYPES = {4: torch.uint8, 8: torch.int8}
CHUNK = 16  # inputs the kernel unpacks at a time: a group is whole chunks
# Above this many rows the product is bound by arithmetic, and torch's GEMM on dequantized tiles
# beats the kernel (bench/cpu_quant_linear.py).
MAX_KERNEL_ROWS = 24
TILE_ELEMENTS = 1 << 21  # weights dequantized at a time: a tile stays in the L2/L3 cache


def _library():
    return native.load("group_quant")


def handles(group_size: int, inputs: int) -> bool:
    """Whether the C kernel computes a layer of these groups (else the reference does)."""
    return group_size % CHUNK == 0 and group_size > 0 and inputs % group_size == 0


def group_quant_linear(
    x, qweight, scale, offset, group_size, bits, bias=None, int8_activations=False
):
    library = _library()
    rows_x = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    inputs = x.shape[-1]
    # float32 activations stay float: those runs are compared exactly with transformers, and
    # int8 rounding (about bf16's) would undo what float32 was asked for
    if (
        int8_activations
        and x.dtype == torch.bfloat16
        and int8_linear.handles(x, qweight, scale, offset, bits, rows_x.shape[0], group_size)
    ):
        return int8_linear.linear(x, qweight, scale, offset, bits, bias, group_size)
    if (
        library is None
        or x.dtype not in _DTYPE_CODES
        or qweight.dtype != _QWEIGHT_DTYPES.get(bits)
        or not handles(group_size, inputs)
        or rows_x.stride(-1) != 1
        or qweight.shape[1] * 8 // bits != inputs
        or not qweight.is_contiguous()
        or not native.takes_scales(scale, offset)
    ):
        return reference.group_quant_linear(x, qweight, scale, offset, group_size, bits, bias)
    rows, outputs = rows_x.shape[0], qweight.shape[0]
    if rows == 0:
        return x.new_empty((*x.shape[:-1], outputs))
    if rows > MAX_KERNEL_ROWS:
        return _tiled(rows_x, qweight, scale, offset, group_size, bits, bias).view(
            *x.shape[:-1], outputs
        )
    out = native.quantized_linear(
        library.group_quant_linear, rows_x, qweight, scale, offset, bias, group_size, bits
    )
    return out.view(*x.shape[:-1], outputs)


def dequantize(
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    group_size: int,
    bits: int,
    dtype: torch.dtype,
    start: int = 0,
    end: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``start .. end`` of the dense weight in ``dtype`` (float32 or bfloat16), by the C
    kernel (which must be available; the reference's `dequantize` otherwise), into `out` (the
    first rows of a contiguous buffer of that dtype) when given."""
    end = qweight.shape[0] if end is None else end
    inputs = qweight.shape[1] * 8 // bits
    shape = (end - start, inputs)
    out = (
        torch.empty(shape, dtype=dtype)
        if out is None
        else out.view(-1)[: shape[0] * inputs].view(shape)
    )
    _library().group_quant_dequantize(
        qweight.data_ptr(),
        scale.data_ptr(),
        offset.data_ptr() if offset is not None else None,
        native.SCALE_DTYPE_CODES[scale.dtype],
        out.data_ptr(),
        _DTYPE_CODES[dtype],
        start,
        end,
        inputs,
        group_size,
        bits,
        torch.get_num_threads(),
    )
    return out


# One tile buffer per dtype, kept between calls: a fresh one would be paged in on every call.
_scratch: dict[torch.dtype, torch.Tensor] = {}


def _tile_buffer(dtype: torch.dtype, elements: int) -> torch.Tensor:
    buffer = _scratch.get(dtype)
    if buffer is None or buffer.numel() < elements:
        buffer = _scratch[dtype] = torch.empty(elements, dtype=dtype)
    return buffer


def _tiled(x, qweight, scale, offset, group_size, bits, bias):
    """Many rows: tiles of weight rows dequantized in x's dtype, each multiplied by torch. The
    rows are padded as `packed_linear` pads them: oneDNN keeps a primitive per shape."""
    rows, (outputs, inputs) = x.shape[0], (qweight.shape[0], x.shape[1])
    padded = packed_linear.padded_rows(rows)
    if padded != rows:
        x = torch.nn.functional.pad(x, (0, 0, 0, padded - rows))
    out = torch.empty((padded, outputs), dtype=x.dtype)
    step = max(CHUNK, TILE_ELEMENTS // inputs)
    buffer = _tile_buffer(x.dtype, min(step, outputs) * inputs)
    for start in range(0, outputs, step):
        end = min(outputs, start + step)
        tile = dequantize(qweight, scale, offset, group_size, bits, x.dtype, start, end, buffer)
        part_bias = bias[start:end] if bias is not None else None
        out[:, start:end] = torch.nn.functional.linear(x, tile, part_bias)
    return out[:rows]
