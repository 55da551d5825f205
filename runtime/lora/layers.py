"""A linear layer with LoRA: ``y = W x + sum over slices of B_i (A_i x)``, each token with its own
adapter (or none), in one batch.

The adapters live in ``max_loras`` slots, stacked so the batched kernels (``ops.lora_shrink`` /
``ops.lora_expand``) pick each token's slot from ``LoRABatch.indices``. A fused layer (QKV,
gate+up) has one slice per projection it holds: the slices' A matrices are stacked along the rank
so one shrink serves them all, then one expand per slice writes its columns.

Tensor parallelism, as in vLLM (not ``--fully-sharded-loras``): a column-parallel layer keeps A
whole and its rank's rows of B; a row-parallel layer keeps its rank's columns of A, and the small
``[T, rank]`` shrink is summed over the ranks before the expand with the whole B.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from infernetes.kernels import ops
from infernetes.runtime.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from infernetes.runtime.model_executor.parallel import all_reduce
from torch import nn


@dataclass
class LoRABatch:
    """The step's adapter slot of every token (``-1``: the base model), shared by all LoRA
    layers; None when no token of the step uses an adapter (the base path alone runs)."""

    indices: torch.Tensor | None = None


@dataclass(frozen=True)
class LoRASlice:
    """One projection inside a (possibly fused) layer, as this rank holds it."""

    name: str  # the PEFT module name: q_proj, gate_proj, o_proj, ...
    offset: int  # first output column on this rank
    size: int  # output columns on this rank
    shard: int  # which block of the full output's rows this rank holds
    full_size: int  # output columns over all ranks (the adapter's B has this many rows)


def layer_slices(layer: LinearBase, name: str, fused: dict[str, list[str]]) -> list[LoRASlice]:
    """The slices of ``layer`` (module leaf ``name``); ``fused`` maps a fused layer's name to the
    projections it holds, in order (from the model's ``stacked_params``)."""
    rank = layer.tp_rank
    if isinstance(layer, QKVParallelLinear):
        q, kv = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
        kv_shard, kv_full = rank // layer.kv_replicas, kv * layer.tp_size // layer.kv_replicas
        q_name, k_name, v_name = fused[name]
        return [
            LoRASlice(q_name, 0, q, rank, q * layer.tp_size),
            LoRASlice(k_name, q, kv, kv_shard, kv_full),
            LoRASlice(v_name, q + kv, kv, kv_shard, kv_full),
        ]
    if isinstance(layer, MergedColumnParallelLinear):
        slices, offset = [], 0
        for part, full in zip(fused[name], layer.output_sizes, strict=True):
            size = full // layer.tp_size
            slices.append(LoRASlice(part, offset, size, rank, full))
            offset += size
        return slices
    if isinstance(layer, RowParallelLinear):
        return [LoRASlice(name, 0, layer.output_size, 0, layer.output_size)]
    return [LoRASlice(name, 0, layer.output_size, rank, layer.output_size * layer.tp_size)]


class LoRALinear(nn.Module):
    def __init__(
        self,
        base: LinearBase,
        slices: list[LoRASlice],
        batch: LoRABatch,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.base = base
        self.slices = slices
        self.batch = batch
        self.max_rank = max_rank
        self.row_parallel = isinstance(base, RowParallelLinear)
        self.input_size = base.input_size  # this rank's (a row-parallel layer's share)
        # A of every slice stacked along the rank: one shrink for the whole layer
        self.a_stack = torch.zeros(
            max_loras, len(slices) * max_rank, self.input_size, dtype=dtype, device=device
        )
        self.b_stacks = [
            torch.zeros(max_loras, s.size, max_rank, dtype=dtype, device=device) for s in slices
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        indices = self.batch.indices
        if indices is None:
            return y
        shrunk = ops.lora_shrink(x, self.a_stack, indices)
        if self.row_parallel and self.base.tp_size > 1:
            shrunk = all_reduce(shrunk)  # each rank holds a share of the input features
        r = self.max_rank
        for i, (piece, b_stack) in enumerate(zip(self.slices, self.b_stacks, strict=True)):
            ops.lora_expand(shrunk[:, i * r : (i + 1) * r], b_stack, indices, y, piece.offset)
        return y

    # -- slots ---------------------------------------------------------------------------------

    def shard(
        self, module: str, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """This rank's ``(A, B * scaling)`` of each slice (None where the adapter leaves it
        alone), from an adapter's full ``{slice name: (A [r, in], B [out, r])}``; shapes checked."""
        full_input = self.input_size * (self.base.tp_size if self.row_parallel else 1)
        sharded: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for piece in self.slices:
            pair = weights.get(piece.name)
            if pair is None:
                sharded.append(None)
                continue
            a, b = pair
            rank = a.shape[0]
            if a.shape != (rank, full_input) or b.shape != (piece.full_size, rank):
                raise ValueError(
                    f"LoRA weights of {module}.{piece.name} have shapes A {tuple(a.shape)}, "
                    f"B {tuple(b.shape)}; the layer takes {full_input} inputs and gives "
                    f"{piece.full_size} outputs"
                )
            if self.row_parallel:
                a = a.narrow(1, self.base.tp_rank * self.input_size, self.input_size)
            else:
                b = b.narrow(0, piece.shard * piece.size, piece.size)
            sharded.append((a.contiguous(), (b * scaling).contiguous()))
        return sharded

    def set_slot(self, slot: int, sharded: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Copy an adapter's sharded weights into ``slot`` (zeros for the slices it leaves alone
        and past its rank)."""
        r = self.max_rank
        self.a_stack[slot].zero_()
        for i, (pair, b_stack) in enumerate(zip(sharded, self.b_stacks, strict=True)):
            b_stack[slot].zero_()
            if pair is None:
                continue
            a, b = pair
            rank = a.shape[0]
            self.a_stack[slot, i * r : i * r + rank].copy_(a)
            b_stack[slot, :, :rank].copy_(b)
