"""LoRAManager: a worker's adapters. It wraps the model's linear layers once (``LoRALinear``),
keeps the adapters it has read on the CPU (an LRU of ``--max-cpu-loras``), puts the ones a step
needs into the ``--max-loras`` device slots (evicting the least recently used slot the step does
not need) and gives every token of the step its slot."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
from infernetes.runtime.config import LoRAConfig
from infernetes.runtime.lora.adapter import (
    LoRAAdapterError,
    adapter_folder,
    read_adapter_config,
    read_adapter_weights,
)
from infernetes.runtime.lora.layers import LoRABatch, LoRALinear, layer_slices
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.model_executor import parallel
from infernetes.runtime.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
)
from torch import nn

logger = logging.getLogger(__name__)

# An adapter as this rank holds it: {layer name: [(A, B * scaling) or None per slice]}
ShardedAdapter = dict[str, list[tuple[torch.Tensor, torch.Tensor] | None]]


class LoRAManager:
    def __init__(
        self, model: nn.Module, config: LoRAConfig, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self.batch = LoRABatch()
        self.layers = _wrap_linear_layers(model, self.batch, config, dtype, device)
        # PEFT module path (model.layers.0.self_attn.q_proj) -> (layer name, slice index)
        self.targets: dict[str, tuple[str, int]] = {}
        for name, layer in self.layers.items():
            parent = name.rpartition(".")[0]
            for i, piece in enumerate(layer.slices):
                self.targets[f"{parent}.{piece.name}" if parent else piece.name] = (name, i)
        self.cpu_cache: OrderedDict[int, ShardedAdapter] = OrderedDict()
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # lora id -> slot, LRU first
        self.requests: dict[int, LoRARequest] = {}

    # -- adapters ------------------------------------------------------------------------------

    def add_lora(self, request: LoRARequest) -> None:
        """Read and check an adapter (ValueError naming the problem); keep it in the CPU cache."""
        self.requests[request.lora_int_id] = request
        self._cached(request)

    def remove_lora(self, lora_int_id: int) -> None:
        self.requests.pop(lora_int_id, None)
        self.cpu_cache.pop(lora_int_id, None)
        self.slot_of.pop(lora_int_id, None)

    def _cached(self, request: LoRARequest) -> ShardedAdapter:
        lora_id = request.lora_int_id
        adapter = self.cpu_cache.get(lora_id)
        if adapter is None:
            adapter = self._read(request)
            self.cpu_cache[lora_id] = adapter
            while len(self.cpu_cache) > self.config.max_cpu_loras:
                self.cpu_cache.popitem(last=False)
        self.cpu_cache.move_to_end(lora_id)
        return adapter

    def _read(self, request: LoRARequest) -> ShardedAdapter:
        folder = adapter_folder(request.lora_path)
        config = read_adapter_config(folder, self.config.max_lora_rank)
        per_layer: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        skip_missing = parallel.state().pp_size > 1  # other stages hold the other layers
        for module, pair in read_adapter_weights(folder).items():
            target = self.targets.get(module)
            if target is None:
                if skip_missing and ".layers." in module:
                    continue
                served = sorted({p.name for layer in self.layers.values() for p in layer.slices})
                raise LoRAAdapterError(
                    f"LoRA adapter {request.lora_name!r} targets {module!r}, which this model "
                    f"does not serve with LoRA (target_modules may be among {served})"
                )
            name, i = target
            per_layer.setdefault(name, {})[self.layers[name].slices[i].name] = pair
        sharded: ShardedAdapter = {}
        for name, parts in per_layer.items():
            try:
                pieces = self.layers[name].shard(name, parts, config.scaling)
            except ValueError as error:
                raise LoRAAdapterError(f"LoRA adapter {request.lora_name!r}: {error}") from None
            sharded[name] = [
                None if p is None else (p[0].to(self.dtype), p[1].to(self.dtype)) for p in pieces
            ]
        return sharded

    # -- a step --------------------------------------------------------------------------------

    def prepare(
        self, lora_requests: Sequence[LoRARequest | None], num_scheduled: Sequence[int]
    ) -> None:
        """Put the step's adapters in slots and give each token its slot (each request's
        ``num_scheduled`` tokens take its adapter's)."""
        if all(r is None for r in lora_requests):
            self.batch.indices = None
            return
        needed = {r.lora_int_id: r for r in lora_requests if r is not None}
        if len(needed) > self.config.max_loras:
            raise RuntimeError(
                f"{len(needed)} adapters scheduled in one step; --max-loras is "
                f"{self.config.max_loras}"
            )
        for lora_id, request in needed.items():
            self._ensure_slot(lora_id, request, needed)
        slots = [
            -1 if r is None else self.slot_of[r.lora_int_id]
            for r, count in zip(lora_requests, num_scheduled, strict=True)
            for _ in range(count)
        ]
        self.batch.indices = torch.tensor(slots, dtype=torch.long, device=self.device)

    def _ensure_slot(
        self, lora_id: int, request: LoRARequest, needed: dict[int, LoRARequest]
    ) -> None:
        if lora_id in self.slot_of:
            self.slot_of.move_to_end(lora_id)
            return
        used = set(self.slot_of.values())
        free = [s for s in range(self.config.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:  # the least recently used adapter this step does not need gives up its slot
            victim = next(i for i in self.slot_of if i not in needed)
            slot = self.slot_of.pop(victim)
        adapter = self._cached(self.requests.setdefault(lora_id, request))
        for name, layer in self.layers.items():
            layer.set_slot(slot, adapter.get(name, [None] * len(layer.slices)))
        self.slot_of[lora_id] = slot


def _wrap_linear_layers(
    model: nn.Module,
    batch: LoRABatch,
    config: LoRAConfig,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, LoRALinear]:
    """Replace every linear layer LoRA can target with a ``LoRALinear`` around it; a fused layer
    only when the model says which projections it holds (``stacked_params``)."""
    fused: dict[str, list[str]] = {}
    for fused_name, part, _ in getattr(model, "stacked_params", ()):
        fused.setdefault(fused_name, []).append(part)
    wrapped: dict[str, LoRALinear] = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, LinearBase) or not getattr(module, "lora_targetable", True):
            continue
        parent_name, _, leaf = name.rpartition(".")
        if isinstance(module, QKVParallelLinear | MergedColumnParallelLinear) and leaf not in fused:
            continue
        slices = layer_slices(module, leaf, fused)
        layer = LoRALinear(
            module, slices, batch, config.max_loras, config.max_lora_rank, dtype, device
        )
        setattr(model.get_submodule(parent_name), leaf, layer)
        wrapped[name] = layer
    if not wrapped:
        raise ValueError(
            f"--enable-lora: {type(model).__name__} has no linear layers LoRA can target"
        )
    return wrapped
