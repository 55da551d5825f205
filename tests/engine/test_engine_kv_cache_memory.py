"""The CPU KV cache is an anonymous map: zeroed as torch.zeros is, written like any tensor."""

from __future__ import annotations

import pytest
import torch
from infernetes.runtime.worker.kv_cache_memory import zeroed


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
)
def test_zeroed_equals_torch_zeros_and_is_writable(dtype):
    shape = (64, 16, 2, 8)
    cache = zeroed(shape, dtype, torch.device("cpu"))
    assert cache.shape == shape and cache.dtype == dtype and cache.is_contiguous()
    assert torch.equal(cache.float(), torch.zeros(shape))
    cache[3, 5] = 1.0
    assert cache.float().sum() == 16
    assert cache.data_ptr() % 4096 == 0  # page-aligned


def test_an_empty_cache_is_an_empty_tensor():
    assert zeroed((0, 16, 2, 8), torch.bfloat16, torch.device("cpu")).numel() == 0
