"""Group-quantized weights (``w[n, k] = q[n, k] * scale[n, k // G] + offset[n, k // G]``), the
form GGUF blocks and GPTQ/AWQ zero points are held in on the CPU: the dense weight and the torch
reference of the linear layer on it.

``qweight``: bits 4, uint8 ``[N, K / 2]`` with input ``2j`` in the low nibble of byte ``j`` and
``2j + 1`` in the high one (values 0..15); bits 8, int8 ``[N, K]``. ``scale`` and ``offset``
(or None) float32 ``[N, K / G]``.
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
    weight = groups * scale.unsqueeze(-1)
    if offset is not None:
        weight = weight + offset.unsqueeze(-1)
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
