"""Sleep level 1's weights: every tensor a model holds (parameters, buffers, and the packed or
quantized forms linear layers keep beside them) copied to host memory and its device storage
released; waking copies each back into the same tensor object, bit for bit, so the layers'
references (and a compiled forward's) stay valid without rebuilding the model. The device
storage is swapped through ``tensor.data``: the tensor object stays."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch
from torch import nn


def _tensors_of(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors_of(getattr(value, field.name))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_of(item)


def own_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """The tensors ``module`` itself holds (by attribute, parameter or buffer), not its
    children's."""
    held = [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]
    for value in held:
        yield from _tensors_of(value)


def model_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Each tensor the model's modules hold (by attribute, parameter or buffer), once."""
    seen: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for tensor in own_tensors(module):
            seen.setdefault(id(tensor), tensor)
    return list(seen.values())


class HostCopy:
    """A model's device tensors, kept in host memory while it sleeps."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        pin = device.type == "cuda"
        for tensor in model_tensors(model):
            # (oneDNN's packed copies, the one non-strided layout, exist only on a CPU)
            if tensor.device != device or tensor.numel() == 0 or tensor.layout != torch.strided:
                continue
            host = torch.empty_like(tensor, device="cpu", pin_memory=pin)
            host.copy_(tensor.detach())
            self.saved.append((tensor, host))
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=device)
        self.bytes = sum(host.numel() * host.element_size() for _, host in self.saved)

    def restore(self) -> None:
        for tensor, host in self.saved:
            tensor.data = host.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.saved = []
