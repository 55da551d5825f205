"""Checkpoint tensors read only where a rank needs them.

A ``LazyWeight`` stands for a safetensors tensor not yet read. The weight loaders narrow it to
their rank's shard (``narrow``, a slice, ``chunk``, ``t`` for GPT-2's transposed Conv1D weights)
at no cost; ``materialize`` then reads just that region through safetensors' ``get_slice`` from
the memory-mapped file. So a tensor-parallel rank reads its shard and the replicated tensors,
never the whole model; ``ReadCounter`` adds up what was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ReadCounter:
    bytes: int = 0


class LazyWeight:
    def __init__(
        self,
        source: Any,  # safetensors' PySafeSlice
        counter: ReadCounter,
        bounds: tuple[tuple[int, int], ...] | None = None,
        transposed: bool = False,
    ) -> None:
        self._source = source
        self._counter = counter
        self._bounds = bounds or tuple((0, n) for n in source.get_shape())
        self._transposed = transposed

    @property
    def shape(self) -> torch.Size:
        sizes = [stop - start for start, stop in self._bounds]
        return torch.Size(reversed(sizes) if self._transposed else sizes)

    @property
    def stored_dtype(self) -> str:
        """The dtype as safetensors names it (``"F32"``, ``"BF16"``, ``"F8_E4M3"``, ``"I32"``)."""
        return str(self._source.get_dtype())

    def dim(self) -> int:
        return len(self._bounds)

    def narrow(self, dim: int, start: int, length: int) -> LazyWeight:
        dim = dim % self.dim()
        if start < 0 or length < 0 or start + length > self.shape[dim]:
            raise IndexError(f"narrow({dim}, {start}, {length}) is outside {tuple(self.shape)}")
        axis = self.dim() - 1 - dim if self._transposed else dim
        bounds = list(self._bounds)
        first = bounds[axis][0] + start
        bounds[axis] = (first, first + length)
        return LazyWeight(self._source, self._counter, tuple(bounds), self._transposed)

    def __getitem__(self, key: slice) -> LazyWeight:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a checkpoint tensor is sliced along its first dimension only")
        start, stop, _ = key.indices(self.shape[0])
        return self.narrow(0, start, max(0, stop - start))

    def chunk(self, chunks: int, dim: int = 0) -> list[LazyWeight]:
        size = -(-self.shape[dim] // chunks)
        return [
            self.narrow(dim, start, min(size, self.shape[dim] - start))
            for start in range(0, self.shape[dim], size)
        ]

    def t(self) -> LazyWeight:
        if self.dim() != 2:
            raise ValueError("t() expects a 2-D checkpoint tensor")
        return LazyWeight(self._source, self._counter, self._bounds, not self._transposed)

    def materialize(self) -> torch.Tensor:
        tensor = self._source[tuple(slice(start, stop) for start, stop in self._bounds)]
        self._counter.bytes += tensor.numel() * tensor.element_size()
        return tensor.t() if self._transposed else tensor


def as_tensor(weight: torch.Tensor | LazyWeight) -> torch.Tensor:
    """The values of ``weight``, read now if it is a ``LazyWeight``."""
    return weight.materialize() if isinstance(weight, LazyWeight) else weight
