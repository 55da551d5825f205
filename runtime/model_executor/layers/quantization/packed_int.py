"""A weight-only int4/int8 linear layer kept packed (``--attention-backend TRITON_ATTN``, the GPU
default): the Triton GEMM dequantises each weight tile in registers, so decode reads the 4- or
8-bit words, not a model-dtype copy. The layout is `infernetes.kernels.reference.wna16`'s.

The checkpoint loader gathers each quantized checkpoint layer's packed form; once the dense
weights are loaded, ``pack_linear_layers`` gives every linear layer whose parts are all there its
``PackedInt`` (a fused layer, such as QKV, concatenates its parts along the outputs) and drops
the dense copy. With tensor parallelism the layers stay dense (each rank's shard of the groups
is not sliced yet)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from infernetes.kernels import ops
from infernetes.kernels.reference.wna16 import dequantize_wna16, pack_along_k
from torch import nn

logger = logging.getLogger(__name__)


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

    def to(self, device: torch.device, scale_dtype: torch.dtype) -> PackedInt:
        return replace(
            self,
            qweight=self.qweight.to(device),
            scales=self.scales.to(device, scale_dtype),
            zeros=self.zeros.to(device) if self.zeros is not None else None,
            g_idx=self.g_idx.to(device, torch.int32),
        )


def concat_outputs(parts: list[PackedInt]) -> PackedInt | None:
    """Parts side by side along the outputs (a fused layer), or None when they do not share their
    input layout (bits, groups, or GPTQ's reordered g_idx)."""
    first = parts[0]
    for part in parts[1:]:
        if (
            part.bits != first.bits
            or part.scales.shape[0] != first.scales.shape[0]
            or not torch.equal(part.g_idx, first.g_idx)
        ):
            return None
    if len({p.zeros is None for p in parts}) > 1:
        midpoint = 2 ** (first.bits - 1)
        parts = [
            p
            if p.zeros is not None
            else replace(p, zeros=torch.full_like(p.scales, midpoint, dtype=torch.int32))
            for p in parts
        ]
    zeros = [p.zeros for p in parts if p.zeros is not None]
    return PackedInt(
        qweight=torch.cat([p.qweight for p in parts], dim=1),
        scales=torch.cat([p.scales for p in parts], dim=1),
        zeros=torch.cat(zeros, dim=1) if zeros else None,
        g_idx=first.g_idx,
        bits=first.bits,
    )


def _checkpoint_parts(name: str, stacked: list[tuple[str, str, object]]) -> list[str]:
    """The checkpoint layers a model layer is made of, in the order the fused weight holds them."""
    fused = [part for fused_name, part, _ in stacked if name.endswith("." + fused_name)]
    if not fused:
        return [name]
    base = name.rpartition(".")[0]
    return [f"{base}.{part}" for part in fused]


def pack_linear_layers(
    model: nn.Module, packed: dict[str, PackedInt], device: torch.device, dtype: torch.dtype
) -> int:
    """Give each linear layer the packed form of its checkpoint parts; returns how many."""
    from infernetes.runtime.model_executor.layers.linear import LinearBase

    stacked = list(getattr(model, "stacked_params", []))
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        pieces = [packed.get(part) for part in _checkpoint_parts(name, stacked)]
        if not all(pieces):
            continue
        fused = concat_outputs([p for p in pieces if p is not None])
        if fused is None:
            logger.info("%s stays dense: its parts' input groups differ", name)
            continue
        module.quant_method = fused.to(device, dtype)
        module.weight.data = module.weight.data.new_empty(0)
        count += 1
    return count


def dummy_pack_linear_layers(
    model: nn.Module, bits: int, group: int, device: torch.device, dtype: torch.dtype, seed: int
) -> int:
    """Random packed weights for every linear layer (``--load-format dummy`` of a model whose
    config declares a weight-only integer method: benchmarks of the shape alone)."""
    from infernetes.runtime.model_executor.layers.linear import LinearBase

    generator = torch.Generator().manual_seed(seed)
    count = 0
    for module in model.modules():
        if isinstance(module, LinearBase) and module.weight.shape[1] % (32 // bits) == 0:
            n, k = module.weight.shape
            module.quant_method = _random_packed(n, k, bits, group, generator).to(device, dtype)
            module.weight.data = module.weight.data.new_empty(0)
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
