"""A weight-only linear layer kept as integers in row-major groups along the inputs:
``w[n, k] = q[n, k] * scale[n, k // group_size] + offset[n, k // group_size]``.

One form covers GGUF's block types exactly (Q8_0, Q4_0, Q4_1 and the K-quants, each block a group
with its own scale and minimum) and GPTQ/AWQ's integer zero points (``offset = -scale * zero``).
Each output row is contiguous, so a CPU kernel streams a row's groups once per step.

``kept.keep_linear_layers`` installs it in the layers after the checkpoint's stream."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from infernetes.kernels import ops
from infernetes.kernels.cpu.group_quant import handles
from infernetes.kernels.cpu.native import SCALE_DTYPE_CODES
from infernetes.kernels.reference import group_quant as reference
from infernetes.kernels.reference.wna16 import unpack_along_k
from torch import nn

if TYPE_CHECKING:
    from infernetes.runtime.model_executor.layers.linear import LinearBase
    from infernetes.runtime.model_executor.layers.quantization.packed_int import PackedInt

BITS = reference.BITS
SCALE_DTYPES = tuple(SCALE_DTYPE_CODES)


@dataclass(frozen=True)
class GroupQuantWeight:
    # bits 4: uint8 [N, K // 2], input 2j in the low nibble and 2j + 1 in the high one, values
    # 0..15; bits 8: int8 [N, K], values -128..127
    qweight: torch.Tensor
    # [N, K // group_size], float32, or float16 where the checkpoint stores them so exactly (GGUF's
    # Q8_0, Q4_0, Q4_1: the C kernels widen them as they read, a quarter of a Q4_1 block's bytes)
    scale: torch.Tensor
    offset: torch.Tensor | None  # the scale's shape and dtype; None: no offset
    group_size: int
    bits: int
    # Decode rows of bf16 x on the CPU are quantized to int8 blocks of 32 and multiplied as
    # integers, as llama.cpp does on the same GGUF file (Q8_0: kernels/cpu/int8_linear.py).
    int8_activations: bool = False

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {self.bits}")
        if self.scale.dtype not in SCALE_DTYPES:
            raise ValueError(f"scale must be one of {SCALE_DTYPES}, got {self.scale.dtype}")
        if self.offset is not None and self.offset.dtype != self.scale.dtype:
            raise ValueError(
                f"offset must be the scale's {self.scale.dtype}, got {self.offset.dtype}"
            )

    @property
    def outputs(self) -> int:
        return self.qweight.shape[0]

    @property
    def inputs(self) -> int:
        return self.qweight.shape[1] * (8 // self.bits)

    def unpacked(self) -> torch.Tensor:
        """The integers ``q`` as int16 ``[N, K]``."""
        return reference.unpack(self.qweight, self.bits)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``[N, K]`` weight."""
        return reference.dequantize(
            self.qweight, self.scale, self.offset, self.group_size, self.bits, dtype
        )

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return ops.group_quant_linear(
            x,
            self.qweight,
            self.scale,
            self.offset,
            self.group_size,
            self.bits,
            bias,
            int8_activations=self.int8_activations,
        )

    @staticmethod
    def from_packed_int(packed: PackedInt) -> GroupQuantWeight | None:
        """A GPTQ/AWQ/compressed-tensors layer in this form (``offset = -scale * zero``), or None
        when its groups are not runs of inputs the CPU kernel takes (GPTQ's act-order ``g_idx``
        reorders them)."""
        inputs = packed.inputs
        first = int(packed.g_idx[0])
        group = int((packed.g_idx == first).sum())
        runs = first + torch.arange(inputs, dtype=torch.int32) // group
        if not handles(group, inputs) or not torch.equal(packed.g_idx.cpu(), runs):
            return None
        groups = slice(first, first + inputs // group)
        scale = packed.scales[groups].t().float().contiguous()  # [N, K / G]
        midpoint = 2 ** (packed.bits - 1)
        zero = midpoint if packed.zeros is None else packed.zeros[groups].t().float()
        values = unpack_along_k(packed.qweight, packed.bits).t()  # [N, K] unsigned
        if packed.bits == 4:
            qweight = (values[:, 0::2] | (values[:, 1::2] << 4)).to(torch.uint8)
            offset: torch.Tensor | None = -scale * zero
        else:  # int8 holds q - 128: the zero point moves with it
            qweight = (values - midpoint).to(torch.int8)
            offset = None if packed.zeros is None else -scale * (zero - midpoint)
        return GroupQuantWeight(
            qweight.contiguous(),
            scale,
            offset.contiguous() if offset is not None else None,
            group,
            packed.bits,
        )

    @staticmethod
    def concat_outputs(parts: list[GroupQuantWeight]) -> GroupQuantWeight | None:
        """Parts one after another along the outputs (a fused layer), or None when their groups
        or scale dtypes differ (`gguf_blocks.in_one_form` makes them alike)."""
        first = parts[0]
        if any(
            (p.bits, p.group_size, p.scale.dtype)
            != (first.bits, first.group_size, first.scale.dtype)
            for p in parts
        ):
            return None
        offset = None
        if any(p.offset is not None for p in parts):
            offset = torch.cat(
                [torch.zeros_like(p.scale) if p.offset is None else p.offset for p in parts]
            )
        return GroupQuantWeight(
            qweight=torch.cat([p.qweight for p in parts]),
            scale=torch.cat([p.scale for p in parts]),
            offset=offset,
            group_size=first.group_size,
            bits=first.bits,
            int8_activations=all(p.int8_activations for p in parts),
        )

    def select_outputs(self, rows: torch.Tensor) -> GroupQuantWeight:
        offset = self.offset[rows] if self.offset is not None else None
        return replace(self, qweight=self.qweight[rows], scale=self.scale[rows], offset=offset)

    def select_inputs(self, start: int, length: int) -> GroupQuantWeight | None:
        """Input features ``start .. start + length`` (a row-parallel rank's), or None when they
        are not whole groups."""
        if start % self.group_size or length % self.group_size:
            return None
        per_byte = 8 // self.bits
        first, count = start // self.group_size, length // self.group_size
        offset = self.offset[:, first : first + count] if self.offset is not None else None
        return replace(
            self,
            qweight=self.qweight[:, start // per_byte : (start + length) // per_byte],
            scale=self.scale[:, first : first + count],
            offset=offset,
        )

    def to(self, device: torch.device) -> GroupQuantWeight:
        offset = self.offset.to(device) if self.offset is not None else None
        return replace(
            self,
            qweight=self.qweight.to(device).contiguous(),
            scale=self.scale.to(device).contiguous(),
            offset=offset.contiguous() if offset is not None else None,
        )

    def install(self, layer: LinearBase, device: torch.device, dtype: torch.dtype) -> None:
        layer.quant_method = self.to(device)
        layer.weight = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)
