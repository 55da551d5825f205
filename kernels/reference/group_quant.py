"""Group-quantized weights (``w[n, k] = q[n, k] * scale[n, k // G] + offset[n, k // G]``), the
form GGUF blocks and GPTQ/AWQ zero points are held in on the CPU: the dense weight and the torch
reference of the linear layer on it.

``qweight``: bits 4, uint8 ``[N, K / 2]`` with input ``2j`` in the low nibble of byte ``j`` and
``2j + 1`` in the high one (values 0..15); bits 8, int8 ``[N, K]``. ``scale`` and ``offset``
(or None) ``[N, K / G]`` of one dtype, float32 or float16 (GGUF's), computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BITS = (4, 8)


def unpack(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """The integers ``q`` as int16 ``[N, K]``."""
    if bits == 8:
        return qweight.to(torch.int16)
    low = (qweight & 0x0F).to(torch.int16)
    high = (qweight >> 4).to(torch.int16)
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], -1)


def dequantize(
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    group_size: int,
    bits: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The ``[N, K]`` weight in ``dtype``, computed in float32."""
    q = unpack(qweight, bits)
    groups = q.float().reshape(q.shape[0], -1, group_size)
    weight = groups * scale.float().unsqueeze(-1)
    if offset is not None:
        weight = weight + offset.float().unsqueeze(-1)
    return weight.reshape(q.shape).to(dtype)


def group_quant_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    group_size: int,
    bits: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ w.T + bias`` with the weight dequantized whole."""
    return F.linear(x, dequantize(qweight, scale, offset, group_size, bits, x.dtype), bias)


def quantize_int8_blocks(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` as llama.cpp quantizes activations for Q8_0 weights: int8 values
    ``[..., K]`` and a float32 scale ``d = max|x| / 127`` per block of ``block`` inputs
    ``[..., K / block]``, each value ``x / d`` rounded to nearest (0 where a block is all 0)."""
    blocks = x.float().reshape(*x.shape[:-1], -1, block)
    scale = blocks.abs().amax(dim=-1) / 127
    inverse = torch.where(scale != 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round(blocks * inverse.unsqueeze(-1)).to(torch.int8)
    return q.reshape(x.shape), scale


def int8_activation_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor | None,
    bits: int,
    bias: torch.Tensor | None = None,
    group: int = 32,
) -> torch.Tensor:
    """``x @ w.T + bias`` for a weight in groups of `group` (32: GGUF's Q8_0, Q4_0, Q4_1; 16:
    Q6_K's), x first quantized by `quantize_int8_blocks` in blocks of 32: the product llama.cpp
    computes (for Q6_K it quantizes x in blocks of 256), here in float64 and returned in x's
    dtype."""
    q, x_scale = quantize_int8_blocks(x, 32)
    rows = q.reshape(-1, x.shape[-1])
    x_int8 = dequantize(rows, x_scale.reshape(rows.shape[0], -1), None, 32, 8, torch.float64)
    weight = dequantize(qweight, scale, offset, group, bits, torch.float64)
    out = F.linear(x_int8, weight, None if bias is None else bias.double())
    return out.reshape(*x.shape[:-1], -1).to(x.dtype)
