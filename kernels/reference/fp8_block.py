"""Block-wise fp8 weights (Hugging Face's fine-grained fp8: DeepSeek-V3, Qwen3-FP8): an fp8
``[N, K]`` weight with one float32 scale per ``bn x bk`` block, ``scale_inv``
``[ceil(N / bn), ceil(K / bk)]`` (the checkpoint's ``weight_scale_inv``: it multiplies). The
linear is weight-only: activations stay in the model dtype and the weight is dequantised (here
whole; in the Triton GEMM tile by tile, so only its fp8 bytes cross memory)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dequantize_block_fp8(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    n, k = weight.shape
    scales = scale_inv.float().repeat_interleave(block[0], 0)[:n]
    scales = scales.repeat_interleave(block[1], 1)[:, :k]
    return (weight.float() * scales).to(dtype)


def quantize_block_fp8(
    weight: torch.Tensor, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ``[..., N, K]`` (experts may lead) as fp8 with one scale per block, each
    block's largest magnitude mapped to fp8's largest: (fp8 weight, ``scale_inv``), the inverse
    of ``dequantize_block_fp8`` up to rounding (for test and benchmark weights)."""
    *lead, n, k = weight.shape
    rows, cols = -(-n // block[0]), -(-k // block[1])
    padded = weight.new_zeros(*lead, rows * block[0], cols * block[1], dtype=torch.float32)
    padded[..., :n, :k] = weight
    tiles = padded.view(*lead, rows, block[0], cols, block[1]).abs().amax(dim=(-3, -1))
    scale_inv = (tiles / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
    spread = scale_inv.repeat_interleave(block[0], -2).repeat_interleave(block[1], -1)
    return (padded / spread)[..., :n, :k].to(torch.float8_e4m3fn), scale_inv


def check_block_shapes(
    x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> None:
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"input of {x.shape[-1]} features does not fit the weight {(n, k)}")
    blocks = (-(-n // block[0]), -(-k // block[1]))
    if tuple(scale_inv.shape) != blocks:
        raise ValueError(
            f"scale_inv {tuple(scale_inv.shape)} does not fit the weight {(n, k)} in "
            f"{block[0]}x{block[1]} blocks ({blocks})"
        )


def block_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias``, ``W`` the dequantised block-wise fp8 weight."""
    return F.linear(x, dequantize_block_fp8(weight, scale_inv, block, x.dtype), bias)
