"""Linear layers that run on the checkpoint's own quantized weights where the Triton kernels run
(``--attention-backend TRITON_ATTN``, the GPU default) on one rank: packed int4/int8
(``packed_int.PackedInt``, the dequantising GEMM) and fp8 with a scale per output
(``Fp8Weight``, the fp8 linear of `infernetes.kernels.ops`).

The loader still loads every layer dense (the layers' own tensor-parallel loaders stay as they
are); the formats hand over each checkpoint layer's stored form on the side, and once loading is
done every linear layer whose parts are all there takes them (a fused layer such as QKV joins
its parts along the outputs) in place of the dense weight. Elsewhere (the CPU's own kernels,
tensor parallelism) the layers stay dense."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from infernetes.runtime.model_executor.layers.quantization.packed_int import PackedInt
from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fp8Weight:
    qweight: torch.Tensor  # float8 [N, K]
    scale: torch.Tensor  # float32 [N]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.qweight.float() * self.scale.reshape(-1, 1)).to(dtype)

    @staticmethod
    def concat_outputs(parts: list[Fp8Weight]) -> Fp8Weight | None:
        # Per-tensor scales of fused parts become per-output ones: the stored values stay exact.
        if len({p.qweight.dtype for p in parts}) > 1:
            return None
        return Fp8Weight(torch.cat([p.qweight for p in parts]), torch.cat([p.scale for p in parts]))

    def install(self, layer: Any, device: torch.device, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(self.qweight.to(device), requires_grad=False)
        layer.weight_scale = nn.Parameter(self.scale.to(device, torch.float32), requires_grad=False)


KeptWeight = PackedInt | Fp8Weight


def fp8_per_output(qweight: torch.Tensor, scale: torch.Tensor) -> Fp8Weight:
    """An fp8 ``[N, K]`` weight with one scale or one per output row."""
    rows = qweight.shape[0]
    return Fp8Weight(qweight, scale.float().reshape(-1).expand(rows).contiguous())


def _checkpoint_parts(name: str, stacked: list[tuple[str, str, object]]) -> list[str]:
    """The checkpoint layers a model layer is made of, in the order the fused weight holds them."""
    fused = [part for fused_name, part, _ in stacked if name.endswith("." + fused_name)]
    if not fused:
        return [name]
    base = name.rpartition(".")[0]
    return [f"{base}.{part}" for part in fused]


def keep_linear_layers(
    model: nn.Module, kept: dict[str, KeptWeight], device: torch.device, dtype: torch.dtype
) -> set[str]:
    """Give each linear layer the stored form of its checkpoint parts; returns the names of the
    parameters they hold now (loaded with them)."""
    from infernetes.runtime.model_executor.layers.linear import LinearBase

    stacked = list(getattr(model, "stacked_params", []))
    held: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        found = [kept.get(part) for part in _checkpoint_parts(name, stacked)]
        pieces = [p for p in found if p is not None]
        if len(pieces) != len(found):
            continue
        joined: KeptWeight | None = None
        if all(isinstance(p, PackedInt) for p in pieces):
            joined = PackedInt.concat_outputs(pieces)  # type: ignore[arg-type]  # checked above
        elif all(isinstance(p, Fp8Weight) for p in pieces):
            joined = Fp8Weight.concat_outputs(pieces)  # type: ignore[arg-type]  # checked above
        if joined is None:
            logger.info("%s stays dense: its parts are stored differently", name)
            continue
        joined.install(module, device, dtype)
        held |= {f"{name}.{param}" for param, _ in module.named_parameters()}
    return held
