"""The process groups of a parallel run and the collectives the layers use.

Ranks are laid out as vLLM lays them out: ``rank = pp_rank * tp_size + tp_rank``. A worker
process calls ``init_distributed`` once (``worker/worker_process.py``); the layers read their
tensor-parallel rank and size from here and shard by them. Without it (one rank, or the offline
engine in its own process) everything is rank 0 of 1 and no collective runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelState:
    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    tp_group: dist.ProcessGroup | None  # None when tp_size == 1
    pp_ranks: tuple[int, ...]  # the global ranks of this rank's pipeline, first stage first
    layer_partition: tuple[int, ...] | None = None  # VLLM_PP_LAYER_PARTITION, else even
    expert_parallel: bool = False  # MoE experts placed whole across the tensor-parallel ranks

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def output_rank(self) -> int:
        """The rank whose sampled tokens are the step's: the first of the last stage."""
        return self.world_size - self.tp_size


_STATE = ParallelState(0, 1, 1, 1, None, (0,))


def init_distributed(
    rank: int,
    tp_size: int,
    pp_size: int,
    init_method: str,
    backend: str,
    layer_partition: tuple[int, ...] | None = None,
    expert_parallel: bool = False,
) -> ParallelState:
    """Join the world group and build the tensor-parallel groups (one per pipeline stage)."""
    global _STATE
    world_size = tp_size * pp_size
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    tp_group = None
    for stage in range(pp_size):  # every rank takes part in creating every group
        ranks = list(range(stage * tp_size, (stage + 1) * tp_size))
        group = dist.new_group(ranks) if tp_size > 1 else None
        if rank in ranks and isinstance(group, dist.ProcessGroup):
            tp_group = group
    pp_ranks = tuple(range(rank % tp_size, world_size, tp_size))
    _STATE = ParallelState(
        rank, world_size, tp_size, pp_size, tp_group, pp_ranks, layer_partition, expert_parallel
    )
    return _STATE


def destroy_distributed() -> None:
    global _STATE
    if dist.is_initialized():
        dist.destroy_process_group()
    _STATE = ParallelState(0, 1, 1, 1, None, (0,))


def state() -> ParallelState:
    return _STATE


def tp_size() -> int:
    return _STATE.tp_size


def tp_rank() -> int:
    return _STATE.tp_rank


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum partial results of a row-parallel layer across the tensor-parallel group."""
    if _STATE.tp_size > 1:
        dist.all_reduce(x, group=_STATE.tp_group)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate the vocabulary shards of the logits."""
    if _STATE.tp_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_STATE.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=_STATE.tp_group)
    return torch.cat(parts, dim=-1)


# -- pipeline parallel ---------------------------------------------------------------------------


def stage_layers(num_layers: int, partition: tuple[int, ...] | None, pp_size: int) -> list[int]:
    """Layers per stage: ``partition`` when given, else an even split whose remainder goes to the
    stages before the last (the first holds the embedding, the last the LM head)."""
    if partition is not None:
        if len(partition) != pp_size or sum(partition) != num_layers or min(partition) < 1:
            raise ValueError(
                f"VLLM_PP_LAYER_PARTITION={','.join(map(str, partition))} must give each of the "
                f"{pp_size} pipeline stages at least one layer, {num_layers} in all"
            )
        return list(partition)
    if num_layers < pp_size:
        raise ValueError(
            f"pipeline_parallel_size {pp_size} is more than the model's {num_layers} layers"
        )
    counts = [num_layers // pp_size] * pp_size
    for stage in range(num_layers % pp_size):  # no remainder with one stage
        counts[-2 - stage] += 1
    return counts


def pp_layer_range(num_layers: int) -> tuple[int, int]:
    """The layers ``[start, end)`` this rank's stage holds."""
    counts = stage_layers(num_layers, _STATE.layer_partition, _STATE.pp_size)
    start = sum(counts[: _STATE.pp_rank])
    return start, start + counts[_STATE.pp_rank]


def send_to_next_stage(tensors: list[torch.Tensor]) -> None:
    peer = _STATE.pp_ranks[_STATE.pp_rank + 1]
    for tensor in tensors:
        dist.send(tensor.contiguous(), peer)


def recv_from_previous_stage(
    count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    peer = _STATE.pp_ranks[_STATE.pp_rank - 1]
    tensors = [torch.empty(shape, dtype=dtype, device=device) for _ in range(count)]
    for tensor in tensors:
        dist.recv(tensor, peer)
    return tensors
