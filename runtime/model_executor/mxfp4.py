"""MXFP4 (OCP microscaling fp4), as gpt-oss checkpoints store their experts: each block of 32
values is 16 bytes of e2m1 nibbles (the low nibble first) and one e8m0 scale byte (a power of two,
biased by 127). Dequantised at load, as transformers does without its GPU kernels."""

from __future__ import annotations

import torch

# The 16 e2m1 values by nibble: sign bit, two exponent bits, one mantissa bit.
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``blocks`` uint8 ``[..., G, 16]`` and ``scales`` uint8 ``[..., G]`` -> ``[..., G * 32]``."""
    if blocks.dtype != torch.uint8 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} ({blocks.dtype}) and scales "
            f"{tuple(scales.shape)} do not fit: blocks are uint8 [..., G, 16], scales [..., G]"
        )
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.reshape(*blocks.shape[:-1], 32)
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return values.reshape(*blocks.shape[:-2], -1).to(dtype)
