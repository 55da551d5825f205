"""AWQ (AutoAWQ's GEMM version): ``qweight`` int32 ``[K, N * bits / 32]`` and ``qzeros`` int32
``[K / group, N * bits / 32]`` packed along the outputs in AWQ's interleaved order (the eight
4-bit values of a word are columns 0, 2, 4, 6, 1, 3, 5, 7 from the low bits up), ``scales``
``[K / group, N]``; ``W[n, k] = (q[k, n] - z[k // group, n]) * s[k // group, n]``."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from infernetes.kernels.reference.wna16 import pack_along_k
from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    CheckpointFormat,
    check_dtype,
    check_shape,
    require,
)
from infernetes.runtime.model_executor.layers.quantization.packed_int import PackedInt

# Column j of a group of eight sits at nibble AWQ_NIBBLE[j] of its word.
AWQ_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, N / 8]`` -> ``[R, N]`` 4-bit values in column order."""
    shifts = torch.tensor(AWQ_NIBBLE, dtype=torch.int32) * 4
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(packed.shape[0], -1)


class AWQFormat(CheckpointFormat):
    method = "awq"
    parts: ClassVar[frozenset[str]] = frozenset({"qweight", "qzeros", "scales"})
    marker = "qweight"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.bits = int(config.get("bits", config.get("w_bit", 4)))
        self.group_size = int(config.get("group_size", config.get("q_group_size", 128)))
        version = str(config.get("version", "gemm")).lower()
        if self.bits != 4:
            raise ValueError(f"AWQ with {self.bits} bits: only 4-bit AWQ is supported")
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r}: only the GEMM packing is supported")
        if config.get("zero_point", True) is False:
            raise ValueError("AWQ without zero points (zero_point: false) is not supported")

    def describe(self) -> str:
        return f"awq (4-bit, group size {self.group_size})"

    def dummy_layout(self) -> tuple[int, int]:
        return 4, self.group_size if self.group_size > 0 else 128

    def dequantize(
        self, prefix: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        return self.kept(prefix, tensors).dequantize(dtype)

    def kept(self, prefix: str, tensors: dict[str, torch.Tensor]) -> PackedInt:
        qweight = tensors["qweight"]
        check_dtype(self, f"{prefix}.qweight", qweight, torch.int32)
        k, n = qweight.shape[0], qweight.shape[1] * 8
        group = self.group_size if self.group_size > 0 else k
        if k % group:
            raise self.error(
                f"{prefix}.qweight", f"has {k} input features, not a multiple of {group}"
            )
        scales = require(self, prefix, tensors, "scales")
        check_shape(self, f"{prefix}.scales", scales, (k // group, n))
        qzeros = require(self, prefix, tensors, "qzeros")
        check_dtype(self, f"{prefix}.qzeros", qzeros, torch.int32)
        check_shape(self, f"{prefix}.qzeros", qzeros, (k // group, n // 8))
        g_idx = torch.arange(k, dtype=torch.int32) // group
        return PackedInt(pack_along_k(unpack_awq(qweight), 4), scales, unpack_awq(qzeros), g_idx, 4)
