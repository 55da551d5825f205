"""Weight-only integer quantisation (w4a16, w8a16): the packed layout the GEMM reads, and the
torch reference of that GEMM.

The layout is GPTQ's, with the zero points unpacked: ``qweight`` int32 ``[K * bits / 32, N]``
holds the unsigned ``bits``-bit values of ``W^T`` packed along K (value ``k`` of a word at bit
``(k % pack) * bits``); ``scales`` ``[G, N]``; ``zeros`` int32 ``[G, N]`` unsigned zero points, or
None for the symmetric midpoint ``2 ** (bits - 1)``; ``g_idx`` int32 ``[K]``, the group of each
input feature (``k // group_size`` unless the checkpoint reordered them, GPTQ's ``desc_act``).
Then ``W[n, k] = (q[k, n] - zeros[g_idx[k], n]) * scales[g_idx[k], n]``. Every checkpoint format
(GPTQ, AWQ, compressed-tensors' pack-quantized) is converted to it at load. A mixture-of-experts
layer stacks its experts' packed weights (``PackedExperts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED_BITS = (4, 8)


def check_bits(bits: int) -> int:
    if bits not in SUPPORTED_BITS:
        raise ValueError(
            f"weight-only integer quantisation supports {SUPPORTED_BITS} bits, not {bits}"
        )
    return 32 // bits


def pack_along_k(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``[K, N]`` unsigned values -> int32 ``[K * bits / 32, N]``."""
    pack = check_bits(bits)
    k, n = values.shape
    if k % pack:
        raise ValueError(f"{k} input features do not fill whole {bits}-bit words of 32 bits")
    words = values.to(torch.int64).reshape(k // pack, pack, n)
    shifts = (torch.arange(pack, device=values.device) * bits).view(1, pack, 1)
    packed = (words << shifts).sum(dim=1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_along_k(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 ``[K * bits / 32, N]`` -> ``[K, N]`` unsigned values (int32)."""
    pack = check_bits(bits)
    shifts = (torch.arange(pack, device=qweight.device, dtype=torch.int32) * bits).view(1, pack, 1)
    values = (qweight.unsqueeze(1) >> shifts) & (2**bits - 1)
    return values.reshape(-1, qweight.shape[1])


def dequantize_wna16(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The ``[N, K]`` weight the packed layout stands for, in ``dtype``."""
    q = unpack_along_k(qweight, bits).float()
    groups = g_idx.long()
    zero = float(2 ** (bits - 1)) if zeros is None else zeros.float()[groups]
    return ((q - zero) * scales.float()[groups]).t().to(dtype)


def wna16_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor,
    bits: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` the packed weight, dequantised whole."""
    return F.linear(x, dequantize_wna16(qweight, scales, zeros, g_idx, bits, x.dtype), bias)


@dataclass(frozen=True)
class PackedExperts:
    """The experts of a mixture-of-experts layer in the packed layout, stacked: ``qweight``
    ``[E, K * bits / 32, N]``, ``scales`` ``[E, G, N]``, ``zeros`` ``[E, G, N]`` or None,
    ``g_idx`` ``[E, K]``; expert ``e`` is the packed ``[N, K]`` weight of its slices."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    g_idx: torch.Tensor
    bits: int

    def to(self, device: torch.device, scale_dtype: torch.dtype) -> PackedExperts:
        return PackedExperts(
            self.qweight.to(device),
            self.scales.to(device, scale_dtype),
            self.zeros.to(device) if self.zeros is not None else None,
            self.g_idx.to(device, torch.int32),
            self.bits,
        )

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``[E, N, K]`` weights."""
        return torch.stack(
            [
                dequantize_wna16(
                    self.qweight[e],
                    self.scales[e],
                    self.zeros[e] if self.zeros is not None else None,
                    self.g_idx[e],
                    self.bits,
                    dtype,
                )
                for e in range(self.qweight.shape[0])
            ]
        )


def check_packed_moe_shapes(
    hidden: torch.Tensor,
    w13: PackedExperts,
    w2: PackedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    for name, packed in (("w13", w13), ("w2", w2)):
        pack = check_bits(packed.bits)
        e, words, n = packed.qweight.shape
        k = words * pack
        if packed.scales.shape[0] != e or packed.scales.shape[2] != n:
            raise ValueError(f"{name} scales {tuple(packed.scales.shape)} do not fit [{e}, G, {n}]")
        if tuple(packed.g_idx.shape) != (e, k):
            raise ValueError(f"{name} g_idx {tuple(packed.g_idx.shape)} is not [{e}, {k}]")
    experts, words, two_i = w13.qweight.shape
    h = words * (32 // w13.bits)
    if hidden.dim() != 2 or hidden.shape[1] != h:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not fit w13 of {h} input features")
    w2_inputs = w2.qweight.shape[1] * (32 // w2.bits)
    if (w2.qweight.shape[0], w2_inputs, w2.qweight.shape[2]) != (experts, two_i // 2, h):
        raise ValueError(
            f"w2 [{experts}, {w2_inputs} inputs, {w2.qweight.shape[2]}] does not fit w13"
        )
    from infernetes.kernels.reference.moe import check_routing

    check_routing(hidden, topk_weights, topk_ids)


def fused_moe_wna16(
    hidden: torch.Tensor,
    w13: PackedExperts,
    w2: PackedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """`infernetes.kernels.reference.moe.fused_moe` over the packed experts, dequantised whole."""
    from infernetes.kernels.reference.moe import fused_moe

    dtype = hidden.dtype
    return fused_moe(hidden, w13.dequantize(dtype), w2.dequantize(dtype), topk_weights, topk_ids)
