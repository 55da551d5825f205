"""Hugging Face's fp8 checkpoints: ``weight`` in float8_e4m3fn with either block-wise
``weight_scale_inv`` ``[ceil(N / bn), ceil(K / bk)]`` (``weight_block_size``, the fine-grained
format of DeepSeek-V3 and Qwen3-FP8) or a per-tensor / per-channel ``weight_scale``, and with
``activation_scheme: static`` an ``input_scale`` per layer. ``W = weight * scale``.

The input scales are checked, not applied: on the CPU the weight is dequantised at load and
activations run in the model dtype; where the Triton kernels run, the weights stay fp8 (kept.py):
per tensor and per channel the fp8 linear quantises the activations dynamically, block-wise the
block fp8 GEMM scales the weight tiles and keeps the activations in the model dtype."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    CheckpointFormat,
    check_dtype,
    check_shape,
    require,
)
from infernetes.runtime.model_executor.layers.quantization.kept import (
    Fp8BlockWeight,
    KeptWeight,
    fp8_per_output,
)
from infernetes.runtime.model_executor.layers.quantization.scales import (
    per_block,
    per_tensor_or_channel,
)

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class Fp8Format(CheckpointFormat):
    method = "fp8"
    parts: ClassVar[frozenset[str]] = frozenset(
        {"weight", "weight_scale", "weight_scale_inv", "input_scale"}
    )

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        block = config.get("weight_block_size")
        self.block = (int(block[0]), int(block[1])) if block else None
        self.static = config.get("activation_scheme", "dynamic") == "static"
        if config.get("activation_scheme", "dynamic") not in ("static", "dynamic"):
            raise ValueError(
                f"activation_scheme {config['activation_scheme']!r}: static or dynamic"
            )
        if self.block and self.static:
            raise ValueError(
                "block-wise fp8 with static activation scales is not a published format"
            )

    @property
    def marker(self) -> str:  # type: ignore[override]  # fixed per checkpoint, not per class
        return "weight_scale_inv" if self.block else "weight_scale"

    def describe(self) -> str:
        if self.block:
            return f"fp8 (block-wise {self.block[0]}x{self.block[1]} weight_scale_inv)"
        return f"fp8 (weight_scale, {'static' if self.static else 'dynamic'} activations)"

    def dequantize(
        self, prefix: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        weight = require(self, prefix, tensors, "weight")
        check_dtype(self, f"{prefix}.weight", weight, *FP8)
        n, k = weight.shape
        other = "weight_scale" if self.block else "weight_scale_inv"
        if other in tensors:
            raise self.error(f"{prefix}.{other}", "belongs to the other fp8 layout")
        if self.block:
            scale = tensors["weight_scale_inv"]
            bn, bk = self.block
            check_shape(self, f"{prefix}.weight_scale_inv", scale, (-(-n // bn), -(-k // bk)))
            return (weight.float() * per_block(scale, (n, k), self.block)).to(dtype)
        scale = tensors["weight_scale"]
        if scale.numel() not in (1, n):
            raise self.error(
                f"{prefix}.weight_scale", f"has {scale.numel()} elements, expected 1 or {n}"
            )
        if self.static:
            check_shape(
                self,
                f"{prefix}.input_scale",
                require(self, prefix, tensors, "input_scale").reshape(-1),
                (1,),
            )
        return (weight.float() * per_tensor_or_channel(scale, n)).to(dtype)

    def kept(self, prefix: str, tensors: dict[str, torch.Tensor]) -> KeptWeight | None:
        """Layers stay fp8: per tensor and per channel with a scale per output, block-wise
        with their block scales."""
        if self.block:
            weight = require(self, prefix, tensors, "weight")
            check_dtype(self, f"{prefix}.weight", weight, *FP8)
            scale = require(self, prefix, tensors, "weight_scale_inv")
            (n, k), (bn, bk) = weight.shape, self.block
            check_shape(self, f"{prefix}.weight_scale_inv", scale, (-(-n // bn), -(-k // bk)))
            return Fp8BlockWeight(weight, scale.float(), self.block)
        self.dequantize(prefix, tensors, torch.float32)  # the checks; cheap next to loading
        return fp8_per_output(tensors["weight"], tensors["weight_scale"])
