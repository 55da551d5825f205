"""compressed-tensors (llm-compressor's checkpoints). ``config_groups`` give each group of layers
(matched by ``targets``: ``Linear``, a name, or ``re:`` a regular expression; ``ignore`` left
out) its weight scheme: ``num_bits``, ``type`` int or float, ``symmetric``, ``strategy`` tensor,
channel, group (``group_size``, with ``actorder`` a ``weight_g_idx``) or block; the ``format``
says how the values are stored:

- ``pack-quantized`` (W4A16, W8A16): ``weight_packed`` int32 ``[N, ceil(K * bits / 32)]``, value
  ``i`` of a row at bit ``i * bits``, offset by ``2 ** (bits - 1)`` to unsigned;
  ``weight_shape`` ``[N, K]``; an asymmetric ``weight_zero_point`` packed the same way along the
  output rows;
- ``int-quantized`` / ``naive-quantized`` (W8A8 int8): ``weight`` int8;
- ``float-quantized`` (W8A8 fp8): ``weight`` float8_e4m3fn.

``weight_scale`` has the strategy's shape; ``W = (q - zero_point) * scale``. Activation
schemes (``input_scale`` when static) are read and checked; activations run in the model dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from infernetes.kernels.reference.wna16 import pack_along_k
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
from infernetes.runtime.model_executor.layers.quantization.packed_int import PackedInt
from infernetes.runtime.model_executor.layers.quantization.scales import (
    per_block,
    per_group,
    per_tensor_or_channel,
)

FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
STRATEGIES = ("tensor", "channel", "group", "block")


@dataclass(frozen=True)
class WeightScheme:
    targets: tuple[str, ...]
    format: str
    num_bits: int
    type: str
    strategy: str
    group_size: int | None
    block: tuple[int, int] | None

    @classmethod
    def from_group(cls, group: dict[str, Any], default_format: str | None) -> WeightScheme:
        weights = group.get("weights") or {}
        fmt = group.get("format") or default_format
        if fmt not in FORMATS:
            raise ValueError(f"compressed-tensors format {fmt!r}: supported {', '.join(FORMATS)}")
        strategy = weights.get("strategy", "tensor")
        if strategy not in STRATEGIES:
            raise ValueError(f"weight strategy {strategy!r}: supported {', '.join(STRATEGIES)}")
        bits, kind = int(weights.get("num_bits", 8)), weights.get("type", "int")
        if (fmt == "float-quantized") != (kind == "float") or bits not in (4, 8):
            raise ValueError(f"{bits}-bit {kind} weights in the {fmt} format are not supported")
        block = weights.get("block_structure")
        return cls(
            targets=tuple(group.get("targets") or ()),
            format=fmt,
            num_bits=bits,
            type=kind,
            strategy=strategy,
            group_size=weights.get("group_size"),
            block=(int(block[0]), int(block[1])) if block else None,
        )


def _matches(prefix: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], prefix) is not None
    # Layer classes (Linear) match any layer with a quantized weight; names match their ending.
    return target == "Linear" or prefix == target or prefix.endswith("." + target)


def unpack_rows(packed: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    """int32 ``[R, W]`` -> ``[R, length]`` unsigned values, value ``i`` at bit ``i * bits``."""
    pack = 32 // bits
    shifts = torch.arange(pack, dtype=torch.int32) * bits
    values = (packed.unsqueeze(-1) >> shifts) & (2**bits - 1)
    return values.reshape(packed.shape[0], -1)[:, :length]


class CompressedTensorsFormat(CheckpointFormat):
    method = "compressed-tensors"
    parts: ClassVar[frozenset[str]] = frozenset(
        {
            "weight",
            "weight_packed",
            "weight_scale",
            "weight_zero_point",
            "weight_shape",
            "weight_g_idx",
            "input_scale",
            "input_zero_point",
        }
    )
    marker = "weight_scale"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        groups = config.get("config_groups") or {}
        if not groups:
            raise ValueError("quantization_config has no config_groups")
        self.schemes = [WeightScheme.from_group(g, config.get("format")) for g in groups.values()]
        self.ignore = tuple(config.get("ignore") or ())

    def scheme(self, prefix: str) -> WeightScheme:
        if any(_matches(prefix, t) for t in self.ignore if t != "Linear"):
            raise self.error(f"{prefix}.weight_scale", "is quantized but the layer is in ignore")
        # A group naming the layer (its name or a regular expression) wins over a class target.
        for by_class in (False, True):
            for scheme in self.schemes:
                targets = [t for t in scheme.targets if (t == "Linear") == by_class]
                if any(_matches(prefix, t) for t in targets):
                    return scheme
        raise self.error(f"{prefix}.weight_scale", "belongs to no config_groups target")

    def dequantize(
        self, prefix: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        scheme = self.scheme(prefix)
        values = self._values(prefix, tensors, scheme)
        n, k = values.shape
        scale = tensors["weight_scale"]
        zero = self._zero_point(prefix, tensors, scheme, n)
        if scheme.strategy == "group":
            g_idx = tensors.get("weight_g_idx")
            size = scheme.group_size or k
            if g_idx is None:
                g_idx = torch.arange(k) // size
            check_shape(self, f"{prefix}.weight_scale", scale, (n, -(-k // size)))
            spread = per_group(scale, g_idx)
            zero = per_group(zero, g_idx) if zero.dim() == 2 and zero.shape[1] > 1 else zero
        elif scheme.strategy == "block":
            assert scheme.block is not None  # checked with the config
            bn, bk = scheme.block
            check_shape(self, f"{prefix}.weight_scale", scale, (-(-n // bn), -(-k // bk)))
            spread = per_block(scale, (n, k), scheme.block)
        else:
            expected = n if scheme.strategy == "channel" else 1
            if scale.numel() != expected:
                raise self.error(
                    f"{prefix}.weight_scale",
                    f"has {scale.numel()} elements, expected {expected} ({scheme.strategy})",
                )
            spread = per_tensor_or_channel(scale, n)
        return ((values.float() - zero) * spread).to(dtype)

    def dummy_layout(self) -> tuple[int, int] | None:
        scheme = self.schemes[0]
        if scheme.format != "pack-quantized":
            return None
        return scheme.num_bits, scheme.group_size or 128

    def kept(self, prefix: str, tensors: dict[str, torch.Tensor]) -> KeptWeight | None:
        """fp8 layers as stored (tensor- and channel-wise with a scale per output, block-wise
        with their block scales); group- and channel-wise pack-quantized ones in the GEMM's
        layout (values and zero points offset back to unsigned)."""
        scheme = self.scheme(prefix)
        if scheme.format == "float-quantized" and scheme.strategy in ("tensor", "channel"):
            self.dequantize(prefix, tensors, torch.float32)  # the checks
            return fp8_per_output(tensors["weight"], tensors["weight_scale"])
        if scheme.format == "float-quantized" and scheme.strategy == "block":
            assert scheme.block is not None  # checked with the config
            self.dequantize(prefix, tensors, torch.float32)  # the checks
            if "weight_zero_point" in tensors and bool(tensors["weight_zero_point"].any()):
                return None  # an offset fp8 grid: dense
            return Fp8BlockWeight(tensors["weight"], tensors["weight_scale"].float(), scheme.block)
        if scheme.format != "pack-quantized" or scheme.strategy not in ("group", "channel"):
            return None
        bits, offset = scheme.num_bits, 2 ** (scheme.num_bits - 1)
        values = self._values(prefix, tensors, scheme)
        n, k = values.shape
        if k % (32 // bits):
            return None
        scale = tensors["weight_scale"].reshape(n, -1)
        if scheme.strategy == "group":
            size = scheme.group_size or k
            check_shape(self, f"{prefix}.weight_scale", scale, (n, -(-k // size)))
            g_idx = tensors.get("weight_g_idx")
            g_idx = torch.arange(k) // size if g_idx is None else g_idx
        else:
            check_shape(self, f"{prefix}.weight_scale", scale, (n, 1))
            g_idx = torch.zeros(k, dtype=torch.int32)
        zeros = None
        if "weight_zero_point" in tensors:
            zero = self._zero_point(prefix, tensors, scheme, n).expand(n, scale.shape[1])
            zeros = (zero + offset).round().to(torch.int32).t().contiguous()
        return PackedInt(
            qweight=pack_along_k((values + offset).t(), bits),
            scales=scale.t().contiguous(),
            zeros=zeros,
            g_idx=g_idx.to(torch.int32),
            bits=bits,
        )

    def _values(
        self, prefix: str, tensors: dict[str, torch.Tensor], scheme: WeightScheme
    ) -> torch.Tensor:
        """The signed quantized values (or fp8 ones) ``[N, K]``."""
        if scheme.format == "pack-quantized":
            packed = require(self, prefix, tensors, "weight_packed")
            check_dtype(self, f"{prefix}.weight_packed", packed, torch.int32)
            n, k = (int(v) for v in require(self, prefix, tensors, "weight_shape").reshape(-1))
            check_shape(self, f"{prefix}.weight_packed", packed, (n, -(-k * scheme.num_bits // 32)))
            return unpack_rows(packed, scheme.num_bits, k) - 2 ** (scheme.num_bits - 1)
        weight = require(self, prefix, tensors, "weight")
        if scheme.format == "float-quantized":
            check_dtype(self, f"{prefix}.weight", weight, torch.float8_e4m3fn, torch.float8_e5m2)
        else:
            check_dtype(self, f"{prefix}.weight", weight, torch.int8)
        return weight

    def _zero_point(
        self, prefix: str, tensors: dict[str, torch.Tensor], scheme: WeightScheme, n: int
    ) -> torch.Tensor:
        zero = tensors.get("weight_zero_point")
        if zero is None or scheme.type == "float":
            return torch.zeros(1, 1)
        if scheme.format == "pack-quantized" and zero.shape[0] == -(-n * scheme.num_bits // 32):
            # Packed along the output rows, offset to unsigned like the weights.
            rows = unpack_rows(zero.t().contiguous(), scheme.num_bits, n).t()
            return (rows - 2 ** (scheme.num_bits - 1)).float()
        return zero.float().reshape(n, -1) if zero.numel() >= n else zero.float().reshape(1, 1)
