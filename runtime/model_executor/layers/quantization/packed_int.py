"""A weight-only int4/int8 linear layer kept packed (``--attention-backend TRITON_ATTN``, the GPU
default): the Triton GEMM dequantises each weight tile in registers, so decode reads the 4- or
8-bit words, not a model-dtype copy. The layout is `infernetes.kernels.reference.wna16`'s.

``kept.keep_linear_layers`` installs it in the layers after the checkpoint's stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from infernetes.kernels import ops
from infernetes.kernels.reference.wna16 import dequantize_wna16, pack_along_k
from torch import nn

if TYPE_CHECKING:
    from infernetes.runtime.model_executor.layers.linear import LinearBase


@dataclass(frozen=True)
class PackedInt:
    qweight: torch.Tensor  # int32 [K * bits / 32, N]
    scales: torch.Tensor  # [G, N]
    zeros: torch.Tensor | None  # int32 [G, N]; None: the symmetric midpoint
    g_idx: torch.Tensor  # int32 [K]
    bits: int

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``[N, K]`` weight."""
        return dequantize_wna16(self.qweight, self.scales, self.zeros, self.g_idx, self.bits, dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return ops.wna16_linear(
            x, self.qweight, self.scales, self.zeros, self.g_idx, self.bits, bias
        )

    @staticmethod
    def concat_outputs(parts: list[PackedInt]) -> PackedInt | None:
        """Parts side by side along the outputs (a fused layer), or None when they do not share
        their input layout (bits, groups, or GPTQ's reordered g_idx)."""
        first = parts[0]
        for part in parts[1:]:
            if (
                part.bits != first.bits
                or part.scales.shape[0] != first.scales.shape[0]
                or not torch.equal(part.g_idx, first.g_idx)
            ):
                return None
        parts = with_common_zeros(parts)
        zeros = [p.zeros for p in parts if p.zeros is not None]
        return PackedInt(
            qweight=torch.cat([p.qweight for p in parts], dim=1),
            scales=torch.cat([p.scales for p in parts], dim=1),
            zeros=torch.cat(zeros, dim=1) if zeros else None,
            g_idx=first.g_idx,
            bits=first.bits,
        )

    @property
    def outputs(self) -> int:
        return self.qweight.shape[1]

    @property
    def inputs(self) -> int:
        return self.qweight.shape[0] * 32 // self.bits

    def select_outputs(self, rows: torch.Tensor) -> PackedInt:
        zeros = self.zeros[:, rows] if self.zeros is not None else None
        return replace(
            self, qweight=self.qweight[:, rows], scales=self.scales[:, rows], zeros=zeros
        )

    def select_inputs(self, start: int, length: int) -> PackedInt | None:
        """Input features ``start .. start + length`` (a row-parallel rank's), or None when they
        do not fall on whole packed words. Every group's scales stay: g_idx may name any."""
        pack = 32 // self.bits
        if start % pack or length % pack:
            return None
        return replace(
            self,
            qweight=self.qweight[start // pack : (start + length) // pack],
            g_idx=self.g_idx[start : start + length],
        )

    def install(self, layer: LinearBase, device: torch.device, dtype: torch.dtype) -> None:
        layer.quant_method = self.to(device, dtype)
        # No dense copy: an empty weight (never the unallocated one a loader would write to).
        layer.weight = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)

    def to(self, device: torch.device, scale_dtype: torch.dtype) -> PackedInt:
        return replace(
            self,
            qweight=self.qweight.to(device),
            scales=self.scales.to(device, scale_dtype),
            zeros=self.zeros.to(device) if self.zeros is not None else None,
            g_idx=self.g_idx.to(device, torch.int32),
        )


def with_common_zeros(parts: list[PackedInt]) -> list[PackedInt]:
    """Parts to be joined: where some have zero points and some do not (symmetric), the latter
    get their midpoint written out, so all have them."""
    if len({p.zeros is None for p in parts}) < 2:
        return parts
    midpoint = 2 ** (parts[0].bits - 1)
    return [
        p
        if p.zeros is not None
        else replace(p, zeros=torch.full_like(p.scales, midpoint, dtype=torch.int32))
        for p in parts
    ]


def dummy_pack_linear_layers(
    model: nn.Module,
    bits: int,
    group: int,
    form: Callable[[PackedInt], Any],
    dtype: torch.dtype,
    seed: int,
) -> int:
    """Random packed weights for every linear layer (``--load-format dummy`` of a model whose
    config declares a weight-only integer method: benchmarks of the shape alone), each in the
    `form` the device reads (None: the layer stays dense)."""
    from infernetes.runtime.model_executor.layers.linear import LinearBase

    generator = torch.Generator().manual_seed(seed)
    count = 0
    for module in model.modules():
        if isinstance(module, LinearBase) and module.weight.shape[1] % (32 // bits) == 0:
            n, k = module.weight.shape
            stored = form(_random_packed(n, k, bits, group, generator))
            if stored is not None:
                stored.install(module, module.weight.device, dtype)
                count += 1
    return count


def _random_packed(n: int, k: int, bits: int, group: int, generator: torch.Generator) -> PackedInt:
    values = torch.randint(0, 2**bits, (k, n), generator=generator)
    groups = -(-k // group)
    return PackedInt(
        qweight=pack_along_k(values, bits),
        scales=torch.full((groups, n), 1e-3 / 2**bits),
        zeros=None,
        g_idx=torch.arange(k, dtype=torch.int32) // group,
        bits=bits,
    )
