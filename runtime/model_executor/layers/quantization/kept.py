"""Linear layers that run on the checkpoint's own quantized weights where the Triton kernels run
(``--attention-backend TRITON_ATTN``, the GPU default): packed int4/int8
(``packed_int.PackedInt``, the dequantising GEMM) and fp8 with a scale per output
(``Fp8Weight``, the fp8 linear of `infernetes.kernels.ops`), block-wise fp8
(``Fp8BlockWeight``, ``ops.block_fp8_linear``).

The model is built with its linear layers' dense weights unallocated
(``deferred_weights.dense_weights_on_first_write``); the formats hand over each checkpoint layer's stored
form instead of a dense weight, and once the stream is done every linear layer whose parts are
all there takes them (a fused layer such as QKV joins its parts along the outputs); with tensor
parallelism, its rank's share, found by running the layer's own loaders over index tensors. The
parts no layer takes (a fused layer whose parts are stored differently, a layer that reads its
weight as a tensor) are then loaded dense like any checkpoint's. So a model that fits on the
device only quantized loads. On the CPU, weight-only integer layers are kept as
`GroupQuantWeight` (loading.device_form), which the CPU's C kernels read packed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from infernetes.kernels import ops
from infernetes.kernels.reference.fp8_block import dequantize_block_fp8
from infernetes.runtime.model_executor.layers.quantization.gguf_blocks import in_one_form
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight
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

    @property
    def outputs(self) -> int:
        return self.qweight.shape[0]

    @property
    def inputs(self) -> int:
        return self.qweight.shape[1]

    def select_outputs(self, rows: torch.Tensor) -> Fp8Weight:
        return Fp8Weight(self.qweight[rows], self.scale[rows])

    def select_inputs(self, start: int, length: int) -> Fp8Weight:
        return Fp8Weight(self.qweight[:, start : start + length], self.scale)

    def install(self, layer: Any, device: torch.device, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(self.qweight.to(device), requires_grad=False)
        layer.weight_scale = nn.Parameter(self.scale.to(device, torch.float32), requires_grad=False)


@dataclass(frozen=True)
class Fp8BlockWeight:
    """A block-wise fp8 layer: ``ops.block_fp8_linear`` scales its tiles in registers."""

    qweight: torch.Tensor  # float8 [N, K]
    scale_inv: torch.Tensor  # float32 [ceil(N / bn), ceil(K / bk)]
    block: tuple[int, int]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_block_fp8(self.qweight, self.scale_inv, self.block, dtype)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return ops.block_fp8_linear(x, self.qweight, self.scale_inv, self.block, bias)

    @staticmethod
    def concat_outputs(parts: list[Fp8BlockWeight]) -> Fp8BlockWeight | None:
        """Parts one after another along the outputs, when each but the last ends on a block."""
        first = parts[0]
        if any(p.block != first.block or p.qweight.dtype != first.qweight.dtype for p in parts):
            return None
        if any(p.outputs % first.block[0] for p in parts[:-1]):
            return None
        return Fp8BlockWeight(
            torch.cat([p.qweight for p in parts]),
            torch.cat([p.scale_inv for p in parts]),
            first.block,
        )

    @property
    def outputs(self) -> int:
        return self.qweight.shape[0]

    @property
    def inputs(self) -> int:
        return self.qweight.shape[1]

    def select_outputs(self, rows: torch.Tensor) -> Fp8BlockWeight | None:
        """The outputs ``rows``, when they are whole blocks (a rank's heads, its slice of a
        merged layer); else None."""
        size = self.block[0]
        if rows.numel() % size:
            return None
        blocks = rows.reshape(-1, size)
        starts = blocks[:, :1]
        if bool((starts % size).any()) or not torch.equal(
            blocks, starts + torch.arange(size, device=rows.device)
        ):
            return None
        return Fp8BlockWeight(self.qweight[rows], self.scale_inv[starts[:, 0] // size], self.block)

    def select_inputs(self, start: int, length: int) -> Fp8BlockWeight | None:
        """Input features ``start .. start + length``, when they start on a block; else None."""
        size = self.block[1]
        if start % size or (length % size and start + length != self.inputs):
            return None
        first, end = start // size, -(-(start + length) // size)
        return Fp8BlockWeight(
            self.qweight[:, start : start + length], self.scale_inv[:, first:end], self.block
        )

    def install(self, layer: Any, device: torch.device, dtype: torch.dtype) -> None:
        layer.quant_method = Fp8BlockWeight(
            self.qweight.to(device), self.scale_inv.to(device, torch.float32), self.block
        )
        layer.weight = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)


KeptWeight = PackedInt | Fp8Weight | Fp8BlockWeight | GroupQuantWeight


def fp8_per_output(qweight: torch.Tensor, scale: torch.Tensor) -> Fp8Weight:
    """An fp8 ``[N, K]`` weight with one scale or one per output row."""
    rows = qweight.shape[0]
    return Fp8Weight(qweight, scale.float().reshape(-1).expand(rows).contiguous())


def checkpoint_parts(name: str, stacked: list[tuple[str, str, Any]]) -> list[tuple[str, Any]]:
    """The checkpoint layers a model layer is made of with their shard ids, in the order the
    fused weight holds them."""
    fused = [
        (part, shard) for fused_name, part, shard in stacked if name.endswith("." + fused_name)
    ]
    if not fused:
        return [(name, None)]
    base = name.rpartition(".")[0]
    return [(f"{base}.{part}", shard) for part, shard in fused]


def _load_indices(layer: Any, shape: tuple[int, int], parts: list[tuple[torch.Tensor, Any]]):
    """What the layer's own weight loaders put where: each part is a tensor of global indices
    shaped like the checkpoint weight along the sharded dimension; the result holds, at each of
    this rank's positions, the index loaded there."""
    target = torch.full(shape, -1.0, dtype=torch.float64)
    for indices, shard in parts:
        if shard is None:
            layer.weight_loader(target, indices)
        else:
            layer.weight_loader(target, indices, shard)
    return target.long()


def _rank_share(layer: Any, joined: KeptWeight, pieces: list[KeptWeight], shards: list[Any]):
    """This rank's share of the joined stored weight, found by running the layer's loaders on
    index tensors (so the QKV replication and merged offsets are the loaders' own), or None."""
    if layer.tp_size == 1 or layer.tp_dim is None:
        return joined
    rows, cols = layer.weight.shape
    if layer.tp_dim == 0:  # column-parallel: which of the joined outputs this rank holds
        parts, offset = [], 0
        for piece, shard in zip(pieces, shards, strict=True):
            ids = torch.arange(offset, offset + piece.outputs, dtype=torch.float64)
            parts.append((ids.reshape(-1, 1), shard))  # one column stands for the row
            offset += piece.outputs
        return joined.select_outputs(_load_indices(layer, (rows, 1), parts)[:, 0])
    ids = torch.arange(cols * layer.tp_size, dtype=torch.float64).reshape(1, -1)
    first = int(_load_indices(layer, (1, cols), [(ids, None)])[0, 0])
    return joined.select_inputs(first, cols)  # row-parallel: a range of the inputs


def keep_linear_layers(
    model: nn.Module, kept: dict[str, KeptWeight], device: torch.device, dtype: torch.dtype
) -> tuple[set[str], set[str]]:
    """Give each linear layer (this rank's share of) the stored form of its checkpoint parts;
    returns the names of the parameters they hold now (loaded with them) and the checkpoint
    layers taken."""
    from infernetes.runtime.model_executor.layers.linear import LinearBase

    stacked = list(getattr(model, "stacked_params", []))
    held: set[str] = set()
    taken: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase) or module.reads_dense_weight:
            continue
        parts = checkpoint_parts(name, stacked)
        found = [kept.get(part) for part, _ in parts]
        pieces = [p for p in found if p is not None]
        if len(pieces) != len(found):
            continue
        joined: KeptWeight | None = None
        if all(isinstance(p, PackedInt) for p in pieces):
            joined = PackedInt.concat_outputs(pieces)  # type: ignore[arg-type]  # checked above
        elif all(isinstance(p, Fp8Weight) for p in pieces):
            joined = Fp8Weight.concat_outputs(pieces)  # type: ignore[arg-type]  # checked above
        elif all(isinstance(p, Fp8BlockWeight) for p in pieces):
            joined = Fp8BlockWeight.concat_outputs(pieces)  # type: ignore[arg-type]  # checked above
        elif all(isinstance(p, GroupQuantWeight) for p in pieces):
            joined = GroupQuantWeight.concat_outputs(in_one_form(pieces))  # type: ignore[arg-type]  # checked above
        if joined is not None:
            joined = _rank_share(module, joined, pieces, [shard for _, shard in parts])
        if joined is None:
            logger.info("%s stays dense: its parts are stored differently", name)
            continue
        joined.install(module, device, dtype)
        held |= {f"{name}.{param}" for param, _ in module.named_parameters()}
        taken |= {part for part, _ in parts}
    return held, taken


def keep_embeddings(
    model: nn.Module, kept: dict[str, KeptWeight], device: torch.device
) -> tuple[set[str], set[str]]:
    """Give each vocabulary table stored as a ``GroupQuantWeight`` (a GGUF file's token
    embedding, its output layer) that form: a lookup dequantises the rows it reads, and an LM
    head tied to the embedding multiplies with the same one. One rank only: a table split over
    ranks loads dense. Returns the parameters held now and the checkpoint layers taken."""
    from infernetes.runtime.model_executor.layers.embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    modules = dict(model.named_modules())
    held: set[str] = set()
    taken: set[str] = set()
    for prefix, form in kept.items():
        table = modules.get(prefix)
        if not isinstance(form, GroupQuantWeight) or not isinstance(table, VocabParallelEmbedding):
            continue
        if table.tp_size > 1 or form.outputs != table.num_embeddings:
            continue
        tied = [
            (name, head)
            for name, head in modules.items()
            if isinstance(head, ParallelLMHead)
            and head is not table
            and head.weight is table.weight
        ]
        stored = form.to(device)
        for name, layer in [(prefix, table), *tied]:
            layer.keep_quantized(stored)
            held.add(f"{name}.weight")
        taken.add(prefix)
    return held, taken
