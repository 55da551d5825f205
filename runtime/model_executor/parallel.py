"""Tensor-parallel rank and size: those of the torch.distributed group when one is initialized,
else rank 0 of 1. The layers shard by these (tests/engine/test_engine_tensor_parallel.py runs
ranks in a gloo group); an executor that starts the ranks is the parallelism issue's."""

from __future__ import annotations

import torch.distributed as dist


def tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x):
    """Sum partial results of a row-parallel layer across the tensor-parallel group."""
    if tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x):
    """Concatenate the vocabulary shards of the logits."""
    size = tp_size()
    if size == 1:
        return x
    import torch

    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=-1)
