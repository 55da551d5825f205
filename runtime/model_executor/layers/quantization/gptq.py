"""GPTQ (AutoGPTQ / GPTQModel): ``qweight`` int32 ``[K * bits / 32, N]`` packed along the input
features, ``qzeros`` int32 ``[G, N * bits / 32]`` packed along the outputs, ``scales``
``[G, N]``, ``g_idx`` int32 ``[K]`` (each input feature's group; reordered with ``desc_act``).
The original ("gptq", v1) checkpoint format stores each zero point minus one; "gptq_v2" does not.
``gptq_marlin`` is vLLM's kernel for the same files and loads here."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from infernetes.kernels.reference.wna16 import check_bits
from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    CheckpointFormat,
    check_dtype,
    check_shape,
    require,
)
from infernetes.runtime.model_executor.layers.quantization.packed_int import PackedInt


def unpack_along_n(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 ``[G, N * bits / 32]`` -> ``[G, N]`` unsigned values, value ``n`` of a word at bit
    ``(n % pack) * bits``."""
    pack = 32 // bits
    shifts = torch.arange(pack, dtype=torch.int32) * bits
    values = (packed.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return values.reshape(packed.shape[0], -1)


class GPTQFormat(CheckpointFormat):
    method = "gptq"
    parts: ClassVar[frozenset[str]] = frozenset({"qweight", "qzeros", "scales", "g_idx"})
    marker = "qweight"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.bits = int(config.get("bits", 4))
        check_bits(self.bits)
        self.group_size = int(config.get("group_size", 128))
        self.desc_act = bool(config.get("desc_act", False))
        checkpoint_format = config.get("checkpoint_format", "gptq")
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(
                f"GPTQ checkpoint_format {checkpoint_format!r}: supported gptq, gptq_v2"
            )
        self.zero_offset = 1 if checkpoint_format == "gptq" else 0

    def describe(self) -> str:
        return f"gptq ({self.bits}-bit, group size {self.group_size})"

    def dummy_layout(self) -> tuple[int, int]:
        return self.bits, self.group_size if self.group_size > 0 else 128

    def dequantize(
        self, prefix: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        return self.kept(prefix, tensors).dequantize(dtype)

    def kept(self, prefix: str, tensors: dict[str, torch.Tensor]) -> PackedInt:
        pack = 32 // self.bits
        qweight = tensors["qweight"]
        check_dtype(self, f"{prefix}.qweight", qweight, torch.int32)
        k, n = qweight.shape[0] * pack, qweight.shape[1]
        group = self.group_size if self.group_size > 0 else k
        groups = -(-k // group)
        scales = require(self, prefix, tensors, "scales")
        check_shape(self, f"{prefix}.scales", scales, (groups, n))
        qzeros = require(self, prefix, tensors, "qzeros")
        check_dtype(self, f"{prefix}.qzeros", qzeros, torch.int32)
        check_shape(self, f"{prefix}.qzeros", qzeros, (groups, n // pack))
        zeros = unpack_along_n(qzeros, self.bits) + self.zero_offset
        g_idx = tensors.get("g_idx")
        if g_idx is None or not self.desc_act:
            # Without desc_act the stored g_idx (if any) is the trivial one, as vLLM assumes.
            g_idx = torch.arange(k, dtype=torch.int32) // group
        else:
            check_shape(self, f"{prefix}.g_idx", g_idx, (k,))
            if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
                raise self.error(f"{prefix}.g_idx", f"names groups outside 0..{groups - 1}")
        return PackedInt(qweight, scales, zeros, g_idx.to(torch.int32), self.bits)
