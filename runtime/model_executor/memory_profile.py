"""Sizing the KV cache from ``--gpu-memory-utilization``, as vLLM does.

A profiling run measures what the model needs besides the KV cache: the weights (torch memory held
after loading), the activation peak of a worst-case step (a forward of ``max_num_batched_tokens``
tokens and the sampler on ``max_num_seqs`` rows) and the memory this engine added on the device
outside torch's allocator (cuBLAS/NCCL workspaces, Triton modules) since a snapshot taken before
the weights were loaded. The KV cache gets the rest of ``total * utilization``. As in vLLM, the
utilization is per instance: memory other processes held at the snapshot is not counted, but it
must leave ``total * utilization`` free at startup.

The arithmetic (``kv_cache_budget``) is a pure function of those readings, and the readings come
through a ``MemoryProbe``, so both are tested on the CPU with a fake probe; ``CudaMemoryProbe`` is
the real one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

GiB = 1 << 30


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GiB:.2f} GiB"


@dataclass(frozen=True)
class MemorySnapshot:
    """Device readings before the engine loads its weights."""

    free: int
    used: int
    torch_reserved: int


@dataclass(frozen=True)
class MemoryProfile:
    """What one profiling run measured, in bytes."""

    total: int  # device memory
    weights: int  # torch memory held before the profiling step (weights, rotary caches)
    activation_peak: int  # torch peak during the step, above what was held when it started
    non_torch: int  # device memory used outside torch's allocator (since the baseline, if any)
    seconds: float = 0.0
    free_at_start: int | None = None  # free device memory in the baseline snapshot


@dataclass(frozen=True)
class KVCacheBudget:
    profile: MemoryProfile
    utilization: float

    @property
    def requested(self) -> int:
        """What this engine may use in all: ``total * utilization``."""
        return int(self.profile.total * self.utilization)

    @property
    def non_kv(self) -> int:
        p = self.profile
        return p.weights + p.activation_peak + p.non_torch

    @property
    def kv_bytes(self) -> int:
        return self.requested - self.non_kv


def kv_cache_budget(profile: MemoryProfile, utilization: float) -> KVCacheBudget:
    """The KV-cache budget; raises ValueError naming ``--gpu-memory-utilization`` and the numbers
    when nothing is left for the cache."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1]; got {utilization}")
    budget = KVCacheBudget(profile, utilization)
    p = profile
    if p.free_at_start is not None and p.free_at_start < budget.requested:
        raise ValueError(
            f"Free memory on device ({_gib(p.free_at_start)}/{_gib(p.total)}) on startup is less than "
            f"desired GPU memory utilization ({utilization}, {_gib(budget.requested)}). Decrease "
            "--gpu-memory-utilization or reduce GPU memory used by other processes."
        )
    if budget.kv_bytes <= 0:
        raise ValueError(
            f"No memory is left for the KV cache: --gpu-memory-utilization {utilization:.2f} of "
            f"{_gib(p.total)} is {_gib(budget.requested)}, but model weights take {_gib(p.weights)}, "
            f"the activation peak {_gib(p.activation_peak)} and non-torch memory {_gib(p.non_torch)} "
            f"({_gib(budget.non_kv)} in all). Raise --gpu-memory-utilization, lower "
            "--max-num-batched-tokens or --max-num-seqs, or free the device."
        )
    return budget


def log_kv_cache_budget(budget: KVCacheBudget) -> None:
    p = budget.profile
    logger.info("Memory profiling takes %.2f seconds", p.seconds)
    logger.info(
        "the current instance can use total_gpu_memory (%s) x gpu_memory_utilization (%.2f) = %s",
        _gib(p.total),
        budget.utilization,
        _gib(budget.requested),
    )
    logger.info(
        "model weights take %s; non_torch_memory takes %s; PyTorch activation peak memory takes %s; "
        "the rest of the memory reserved for KV Cache is %s.",
        _gib(p.weights),
        _gib(p.non_torch),
        _gib(p.activation_peak),
        _gib(budget.kv_bytes),
    )
    logger.info("Available KV cache memory: %s", _gib(budget.kv_bytes))


def log_kv_cache_capacity(
    device_kind: str, num_blocks: int, block_size: int, max_model_len: int
) -> None:
    """The capacity lines every engine logs once its cache is sized (CPU or GPU)."""
    capacity = num_blocks * block_size
    logger.info("# %s blocks: %d (block size %d)", device_kind, num_blocks, block_size)
    logger.info("%s KV cache size: %s tokens", device_kind, f"{capacity:,}")
    logger.info(
        "Maximum concurrency for %s tokens per request: %.2fx",
        f"{max_model_len:,}",
        capacity / max_model_len,
    )


def kv_cache_num_blocks(
    available_bytes: int,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    num_blocks_override: int | None = None,
) -> int:
    """How many KV blocks the cache gets: ``--num-gpu-blocks-override``, else as many as fit in
    ``available_bytes``. Raises ValueError when one request of ``max_model_len`` would not fit."""
    num_blocks = num_blocks_override or available_bytes // bytes_per_block
    capacity = num_blocks * block_size
    if capacity < max_model_len:
        raise ValueError(
            f"The model's max seq len ({max_model_len}) is larger than the maximum number of "
            f"tokens that can be stored in KV cache ({capacity}). Try increasing the KV cache "
            "(--gpu-memory-utilization, --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, "
            "--num-gpu-blocks-override) or decreasing --max-model-len."
        )
    return num_blocks


class MemoryProbe(Protocol):
    """Memory readings of one device, in bytes."""

    def total(self) -> int: ...

    def used(self) -> int:
        """Everything in use on the device (total minus free, as the driver reports it)."""
        ...

    def allocated(self) -> int: ...

    def peak_allocated(self) -> int: ...

    def reserved(self) -> int: ...

    def reset_peak(self) -> None: ...

    def settle(self) -> None:
        """Wait for queued work and return cached free blocks to the device."""
        ...


class CudaMemoryProbe:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def total(self) -> int:
        return torch.cuda.mem_get_info(self.device)[1]

    def used(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def peak_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def settle(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


def memory_snapshot(probe: MemoryProbe) -> MemorySnapshot:
    probe.settle()
    used = probe.used()
    return MemorySnapshot(free=probe.total() - used, used=used, torch_reserved=probe.reserved())


def profile_memory(
    probe: MemoryProbe,
    setup: Callable[[], None],
    step: Callable[[], None],
    teardown: Callable[[], None],
    baseline: MemorySnapshot | None = None,
) -> MemoryProfile:
    """Measure a worst-case ``step``. ``setup`` allocates what the step needs but is not part of
    its cost (a KV cache just large enough for the dummy batch); ``teardown`` frees it. Non-torch
    memory counts from ``baseline`` (taken before the weights loaded) when given, else all of it."""
    start = time.perf_counter()
    probe.settle()
    weights = probe.allocated()
    setup()
    try:
        probe.settle()
        before = probe.allocated()
        probe.reset_peak()
        step()
        probe.settle()
        peak = max(probe.peak_allocated() - before, 0)
    finally:
        teardown()
    probe.settle()
    non_torch = probe.used() - probe.reserved()
    if baseline is not None:
        non_torch -= baseline.used - baseline.torch_reserved
    return MemoryProfile(
        probe.total(),
        weights,
        peak,
        max(non_torch, 0),
        time.perf_counter() - start,
        None if baseline is None else baseline.free,
    )


__all__ = [
    "CudaMemoryProbe",
    "KVCacheBudget",
    "MemoryProbe",
    "MemoryProfile",
    "MemorySnapshot",
    "kv_cache_budget",
    "kv_cache_num_blocks",
    "log_kv_cache_budget",
    "log_kv_cache_capacity",
    "memory_snapshot",
    "profile_memory",
]
