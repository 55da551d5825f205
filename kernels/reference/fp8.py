"""fp8 quantisation: per-tensor and per-channel scales, and the dequantising linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Smallest scale we hand out, so an all-zero tensor does not divide by zero.
MIN_SCALE = 1e-12


def check_fp8_dtype(dtype: torch.dtype) -> None:
    if dtype not in FP8_DTYPES:
        raise ValueError(f"fp8 dtype must be one of {FP8_DTYPES}, got {dtype}")


def quantize_to_fp8(
    x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype
) -> torch.Tensor:
    """x / scale, saturated to the fp8 range and rounded to `dtype`."""
    fp8_max = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-fp8_max, fp8_max).to(dtype)


def scaled_fp8_quant(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise with a given scale, or a dynamic per-tensor one (amax / fp8 max)."""
    check_fp8_dtype(dtype)
    if scale is None:
        amax = x.abs().max().float() if x.numel() else torch.zeros((), device=x.device)
        scale = (amax / torch.finfo(dtype).max).clamp(min=MIN_SCALE)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return quantize_to_fp8(x, scale, dtype), scale


def quantize_weight_fp8(
    weight: torch.Tensor,
    per_channel: bool = False,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a `[N, K]` weight: one scale, or one per output row (`[N]`)."""
    check_fp8_dtype(dtype)
    if not per_channel:
        return scaled_fp8_quant(weight, dtype=dtype)
    amax = weight.abs().amax(dim=1).float()
    scale = (amax / torch.finfo(dtype).max).clamp(min=MIN_SCALE)
    return quantize_to_fp8(weight, scale[:, None], dtype), scale


def dequantize_weight(
    qweight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    scale = weight_scale.float()
    if scale.numel() > 1:
        scale = scale.reshape(-1, 1)
    return (qweight.float() * scale).to(dtype)


def fp8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ (qweight * weight_scale).T + bias` with `qweight` `[N, K]` fp8 and a scale that is
    per-tensor (one element) or per-channel (`[N]` or `[N, 1]`)."""
    return F.linear(x, dequantize_weight(qweight, weight_scale, x.dtype), bias)
