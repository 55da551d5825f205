"""--cpu-offload-gb: the first decoder layers' weights kept in host memory, streamed to the device
for each forward.

Whole layers are taken from the first while their total stays within the budget (vLLM offloads
from the first layer too). Each offloaded tensor (parameters, buffers and the packed or quantized
forms a linear layer keeps, as ``weight_offload.model_tensors`` finds them) gets a host copy,
pinned where the platform allows so the copy to the device can be asynchronous, and its device
storage is released. A forward pre-hook gives each tensor a device copy (``non_blocking``, on the
current stream, so it is ordered before the layer's kernels) and a post-hook drops it again: the
device holds the layers not offloaded plus one offloaded layer at a time. The tensor objects stay
(their storage is swapped through ``tensor.data``), so the layers' references remain valid.
Tensors a layer shares with another layer or the rest of the model (a rotary cache) stay put.

The copies are Python hooks: a CUDA graph would replay freed addresses, so the engine config
turns graphs off with it and the runner does not compile the forward (vLLM's UVA path, which
reads host memory in place from the kernels, is not built here).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from infernetes.runtime.worker.weight_offload import model_tensors, own_tensors
from torch import nn

logger = logging.getLogger(__name__)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks in order: the ModuleList holding the most parameters."""
    best: list[nn.Module] = []
    best_bytes = -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            held = sum(p.numel() * p.element_size() for p in module.parameters())
            if held > best_bytes:
                best, best_bytes = list(module), held
    return best


def _shared(model: nn.Module, layers: list[nn.Module]) -> set[int]:
    """Ids of the tensors held by more than one layer, or by a layer and the rest of the model."""
    inside = {id(m) for layer in layers for m in layer.modules()}
    holders: list[list[torch.Tensor]] = [model_tensors(layer) for layer in layers]
    holders += [list(own_tensors(m)) for m in model.modules() if id(m) not in inside]
    count: dict[int, int] = {}
    for tensors in holders:
        for key in {id(t) for t in tensors}:
            count[key] = count.get(key, 0) + 1
    return {key for key, n in count.items() if n > 1}


def _offloadable(layer: nn.Module, device: torch.device, shared: set[int]) -> list[torch.Tensor]:
    # (oneDNN's packed copies, the one non-strided layout, exist only on a CPU)
    return [
        t
        for t in model_tensors(layer)
        if t.device == device
        and t.numel() > 0
        and t.layout == torch.strided
        and id(t) not in shared
    ]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class OffloadedLayer:
    """One layer whose tensors live in host memory between its forwards."""

    def __init__(self, layer: nn.Module, tensors: list[torch.Tensor], device: torch.device) -> None:
        self.device = device
        pin = torch.cuda.is_available()  # pinning needs a CUDA runtime
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for tensor in tensors:
            host = torch.empty_like(tensor, device="cpu", pin_memory=pin)
            host.copy_(tensor.detach())
            self.saved.append((tensor, host))
        self.bytes = _bytes([host for _, host in self.saved])
        self._release()
        layer.register_forward_pre_hook(self._fetch)
        layer.register_forward_hook(self._drop)

    def _fetch(self, module: nn.Module, args: Any) -> None:
        for tensor, host in self.saved:
            tensor.data = host.to(self.device, non_blocking=True)

    def _drop(self, module: nn.Module, args: Any, output: Any) -> None:
        self._release()

    def _release(self) -> None:
        for tensor, _ in self.saved:
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=self.device)


def offload_layers(
    model: nn.Module, budget_bytes: int, device: torch.device
) -> list[OffloadedLayer]:
    """Move whole decoder layers, from the first, to host memory while their total stays within
    ``budget_bytes``; the layers offloaded (none for a budget of 0)."""
    if budget_bytes <= 0:
        return []
    layers = decoder_layers(model)
    shared = _shared(model, layers)
    offloaded: list[OffloadedLayer] = []
    total = 0
    for layer in layers:
        tensors = _offloadable(layer, device, shared)
        if total + _bytes(tensors) > budget_bytes:
            break
        offloaded.append(OffloadedLayer(layer, tensors, device))
        total += offloaded[-1].bytes
    if device.type == "cuda":
        torch.cuda.empty_cache()
    logger.info(
        "--cpu-offload-gb: %d of %d decoder layers (%.4f GiB) kept in host memory, copied to the "
        "device for each forward",
        len(offloaded),
        len(layers),
        total / 2**30,
    )
    return offloaded
