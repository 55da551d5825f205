"""The checkpoint's quantized tensors turned into the dense weights the model's layers load (or,
where the GPU kernels take a layer as stored, set aside in that form).

A quantized linear layer ``prefix`` is stored as several tensors (``prefix.qweight``,
``prefix.scales``, ...). They arrive in any order, across files, so each layer's parts are
gathered (as lazy handles: nothing is read yet) and dequantised once the stream ends, then
handed on as ``prefix.weight``; the layers' own loaders then take their tensor-parallel shard as
they do for any checkpoint. Attention's KV-cache scales are collected on the side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from infernetes.runtime.model_executor.lazy_weight import LazyWeight, as_tensor

if TYPE_CHECKING:
    from infernetes.runtime.model_executor.layers.quantization.kept import KeptWeight

Weight = torch.Tensor | LazyWeight

# Every suffix a quantized layer's tensors carry in the formats we know: one a format does not
# use means the checkpoint is not what its config says.
QUANT_PARTS = frozenset(
    {
        "qweight",
        "qzeros",
        "scales",
        "g_idx",
        "weight_packed",
        "weight_scale",
        "weight_zero_point",
        "weight_shape",
        "weight_g_idx",
        "weight_scale_inv",
        "input_scale",
        "input_zero_point",
    }
)
# KV-cache scales: ``<attention>.k_scale`` (vLLM, llm-compressor) or the older
# ``<attention>.k_proj.output_scale``.
KV_SCALE_NAMES = {
    "k_scale": "k",
    "v_scale": "v",
    "k_proj.output_scale": "k",
    "v_proj.output_scale": "v",
}


class CheckpointError(ValueError):
    """A tensor does not fit the checkpoint's declared quantization method."""


class CheckpointFormat(ABC):
    """One quantization method's on-disk layout."""

    method: ClassVar[str]
    # The suffixes of this format's quantized layers; ``marker`` is the one every such layer has.
    parts: ClassVar[frozenset[str]]
    marker: ClassVar[str]

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    @abstractmethod
    def dequantize(
        self, prefix: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        """The ``[out, in]`` weight of layer ``prefix`` in ``dtype`` from its parts (read)."""

    def kept(self, prefix: str, tensors: dict[str, torch.Tensor]) -> KeptWeight | None:
        """The layer in a form the GPU kernels take as stored (packed int4/int8, fp8 with one
        scale per output), when this format and layer have one."""
        return None

    def dummy_layout(self) -> tuple[int, int] | None:
        """``(bits, group size)`` of a weight-only integer format, for ``--load-format dummy``."""
        return None

    def error(self, name: str, problem: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint tensor {name!r} {problem} (quantization method {self.describe()})"
        )

    def describe(self) -> str:
        return self.method


def _split(name: str) -> tuple[str, str]:
    prefix, _, suffix = name.rpartition(".")
    return prefix, suffix


def _kv_scale(name: str) -> tuple[str, str] | None:
    """``(attention prefix, "k" | "v")`` for a KV-cache scale's name."""
    for ending, which in KV_SCALE_NAMES.items():
        if name.endswith("." + ending):
            prefix = name[: -len(ending) - 1]
            return prefix.removesuffix(".k_proj").removesuffix(".v_proj"), which
    return None


def dequantized_weights(
    weights: Iterable[tuple[str, Weight]],
    fmt: CheckpointFormat | None,
    dtype: torch.dtype,
    kv_scales: dict[str, dict[str, float]],
    kept: dict[str, KeptWeight] | None = None,
) -> Iterator[tuple[str, Weight]]:
    """The checkpoint's tensors with each quantized layer's parts replaced by its dense
    ``prefix.weight`` in ``dtype``. ``kv_scales`` receives ``{attention prefix: {"k": s, "v":
    s}}``. Without ``fmt`` (an unquantised checkpoint) only the KV scales are taken out. With
    ``kept``, layers the GPU kernels take as stored go there instead, by prefix."""
    groups: dict[str, dict[str, Weight]] = {}
    parts = fmt.parts if fmt is not None else frozenset()
    first_plain: str | None = None
    for name, tensor in weights:
        kv = _kv_scale(name)
        if kv is not None:
            kv_scales.setdefault(kv[0], {})[kv[1]] = float(as_tensor(tensor).float().reshape(-1)[0])
            continue
        prefix, suffix = _split(name)
        if suffix in parts:
            groups.setdefault(prefix, {})[suffix] = tensor
        elif suffix in QUANT_PARTS:
            what = (
                f"the {fmt.describe()} format" if fmt is not None else "an unquantised checkpoint"
            )
            raise CheckpointError(
                f"checkpoint tensor {name!r} is not part of {what}: the checkpoint's tensors do "
                "not match its quantization_config"
            )
        else:
            if first_plain is None and suffix == "weight":
                first_plain = name
            yield name, tensor
    if fmt is None:
        return
    quantized = 0
    for prefix, group in groups.items():
        if fmt.marker not in group:
            yield from _unquantized(fmt, prefix, group)
            continue
        quantized += 1
        read = {suffix: as_tensor(tensor) for suffix, tensor in group.items()}
        layer = fmt.kept(prefix, read) if kept is not None else None
        if layer is not None and kept is not None:
            kept[prefix] = layer  # not loaded dense: loading.load_quantized places it
        else:
            yield prefix + ".weight", fmt.dequantize(prefix, read, dtype)
    if not quantized:
        first_plain = first_plain or next((p + ".weight" for p in groups), None)
        example = f"; e.g. {first_plain!r} is a plain weight" if first_plain else ""
        raise CheckpointError(
            f"the checkpoint declares quantization method {fmt.describe()} but none of its "
            f"tensors is a quantized weight of that method (a '.{fmt.marker}' tensor){example}"
        )


def _unquantized(
    fmt: CheckpointFormat, prefix: str, group: dict[str, Weight]
) -> Iterator[tuple[str, Weight]]:
    """A layer the method left in full precision (its ``ignore`` list): only a float weight."""
    weight = group.get("weight")
    if weight is not None and not _is_float(weight):
        raise fmt.error(
            f"{prefix}.weight", f"is quantized but the layer has no scale ({fmt.marker})"
        )
    extra = sorted(set(group) - {"weight"})
    if weight is None or extra:
        name = f"{prefix}.{extra[0] if extra else 'weight'}"
        raise fmt.error(name, f"comes without the layer's '{fmt.marker}' tensor")
    yield prefix + ".weight", weight


def _is_float(weight: Weight) -> bool:
    """A 16- or 32-bit float tensor (not fp8, not an integer), without reading a lazy one."""
    if isinstance(weight, LazyWeight):
        return weight.stored_dtype in ("F16", "BF16", "F32", "F64")
    return weight.is_floating_point() and weight.element_size() > 1


def check_shape(
    fmt: CheckpointFormat, name: str, tensor: torch.Tensor, shape: tuple[int, ...]
) -> None:
    if tuple(tensor.shape) != shape:
        raise fmt.error(name, f"has shape {list(tensor.shape)}, expected {list(shape)}")


def check_dtype(
    fmt: CheckpointFormat, name: str, tensor: torch.Tensor, *dtypes: torch.dtype
) -> None:
    if tensor.dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise fmt.error(name, f"is {str(tensor.dtype).removeprefix('torch.')}, expected {allowed}")


def require(
    fmt: CheckpointFormat, prefix: str, tensors: dict[str, torch.Tensor], suffix: str
) -> torch.Tensor:
    if suffix not in tensors:
        raise fmt.error(f"{prefix}.{fmt.marker}", f"comes without '{prefix}.{suffix}'")
    return tensors[suffix]
