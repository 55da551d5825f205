"""Zeroed KV-cache tensors that cost nothing until they are used.

On a CPU the cache is sized from VLLM_CPU_KVCACHE_SPACE (4 GiB by default), and ``torch.zeros``
writes every byte of it at startup: seconds of CPU and gigabytes of resident memory before the
first request. An anonymous private mapping is zero by the kernel's guarantee and gets its pages
only when they are first written, so the cache is just as zeroed (see
``ModelRunner.allocate_kv_cache`` for why it must be) and costs what is used.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``; on a CPU backed by an anonymous map."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * dtype.itemsize
    if num_bytes == 0:
        return torch.zeros(shape, dtype=dtype)
    memory = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # frombuffer keeps the map alive as long as the tensor; the map is page-aligned.
    return torch.frombuffer(memory, dtype=torch.uint8).view(dtype).view(shape)
