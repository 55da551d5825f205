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
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from infernetes.runtime.model_executor.layers.linear import LinearBase

BITS = (4, 8)


@dataclass(frozen=True)
class GroupQuantWeight:
    # bits 4: uint8 [N, K // 2], input 2j in the low nibble and 2j + 1 in the high one, values
    # 0..15; bits 8: int8 [N, K], values -128..127
    qweight: torch.Tensor
    scale: torch.Tensor  # float32 [N, K // group_size]
    offset: torch.Tensor | None  # float32 [N, K // group_size]; None: no offset
    group_size: int
    bits: int

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {self.bits}")

    @property
    def outputs(self) -> int:
        return self.qweight.shape[0]

    @property
    def inputs(self) -> int:
        return self.qweight.shape[1] * (8 // self.bits)

    def unpacked(self) -> torch.Tensor:
        """The integers ``q`` as int16 ``[N, K]``."""
        if self.bits == 8:
            return self.qweight.to(torch.int16)
        low = (self.qweight & 0x0F).to(torch.int16)
        high = (self.qweight >> 4).to(torch.int16)
        return torch.stack((low, high), dim=-1).reshape(self.outputs, self.inputs)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``[N, K]`` weight."""
        groups = self.unpacked().float().reshape(self.outputs, -1, self.group_size)
        weight = groups * self.scale.unsqueeze(-1)
        if self.offset is not None:
            weight = weight + self.offset.unsqueeze(-1)
        return weight.reshape(self.outputs, self.inputs).to(dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype), bias)

    @staticmethod
    def concat_outputs(parts: list[GroupQuantWeight]) -> GroupQuantWeight | None:
        """Parts one after another along the outputs (a fused layer), or None when their groups
        differ."""
        first = parts[0]
        if any(p.bits != first.bits or p.group_size != first.group_size for p in parts):
            return None
        offsets = [p.offset for p in parts]
        if any(o is None for o in offsets) and any(o is not None for o in offsets):
            offsets = [torch.zeros_like(p.scale) if p.offset is None else p.offset for p in parts]
        return GroupQuantWeight(
            qweight=torch.cat([p.qweight for p in parts]),
            scale=torch.cat([p.scale for p in parts]),
            offset=None if offsets[0] is None else torch.cat(offsets),  # type: ignore[arg-type]
            group_size=first.group_size,
            bits=first.bits,
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
            scale=self.scale.to(device, torch.float32).contiguous(),
            offset=offset.contiguous() if offset is not None else None,
        )

    def install(self, layer: LinearBase, device: torch.device, dtype: torch.dtype) -> None:
        layer.quant_method = self.to(device)
        layer.weight = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)
