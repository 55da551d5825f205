"""What the worker calls on a model: every class in ``models/`` provides it (generative models
``compute_logits``, pooling models ``pool``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
from torch import nn

# The model forward as the runner calls it, eager, compiled or a graph replay:
# (input_ids, positions) -> hidden states.
ModelForward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ServableModel(Protocol):
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor: ...

    def pool(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]: ...

    def modules(self) -> Iterator[nn.Module]: ...

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...
