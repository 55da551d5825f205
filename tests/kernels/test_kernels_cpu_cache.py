"""The CPU path's C kernel that writes keys and values into the paged cache writes what the torch
reference writes, bit for bit, skips slot -1, refuses a slot past the cache, and leaves fp8
caches (which store ``x / scale``) to the reference."""

from __future__ import annotations

import pytest
import torch
from infernetes.kernels import ops
from infernetes.kernels.cpu import cache, native
from infernetes.kernels.reference import cache as reference

BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 6, 4, 3, 16


@pytest.fixture(autouse=True)
def _needs_the_kernel():
    if native.load("cache") is None:
        pytest.skip("no C compiler: the CPU path runs the torch reference")


def _caches(dtype: torch.dtype, count: int = 4) -> list[torch.Tensor]:
    shape = (BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    first = torch.randn(shape).to(dtype)  # not zeros: untouched slots must stay as they were
    return [first.clone() for _ in range(count)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_kv_writes_what_the_reference_writes(dtype):
    gen = torch.Generator().manual_seed(0)
    tokens = 7
    # strided views of a fused projection, as the attention layers pass them
    fused = torch.randn(tokens, 3 * KV_HEADS * HEAD_DIM, generator=gen).to(dtype)
    key = fused[:, : KV_HEADS * HEAD_DIM].view(tokens, KV_HEADS, HEAD_DIM)
    value = fused[:, KV_HEADS * HEAD_DIM : 2 * KV_HEADS * HEAD_DIM].view(tokens, KV_HEADS, HEAD_DIM)
    slots = torch.tensor([5, -1, 0, 23, 12, -1, 1])
    k_c, v_c, k_r, v_r = _caches(dtype)
    cache.store_kv(key, value, k_c, v_c, slots)
    reference.store_kv(key, value, k_r, v_r, slots)
    assert torch.equal(k_c, k_r) and torch.equal(v_c, v_r)
    written = k_c.view(-1, KV_HEADS, HEAD_DIM)
    assert torch.equal(written[23], key[3]) and torch.equal(written[0], key[2])


def test_ops_route_cpu_tensors_to_the_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(cache, "store_kv", lambda *args: calls.append(args))
    key = torch.randn(1, KV_HEADS, HEAD_DIM)
    k_c, v_c = _caches(torch.float32, 2)
    ops.store_kv(key, key, k_c, v_c, torch.tensor([3]))
    assert len(calls) == 1


def test_a_slot_past_the_cache_is_refused():
    key = torch.randn(2, KV_HEADS, HEAD_DIM)
    k_c, v_c = _caches(torch.float32, 2)
    with pytest.raises(IndexError, match=r"slot_mapping\[1\] = 24"):
        cache.store_kv(key, key, k_c, v_c, torch.tensor([0, BLOCKS * BLOCK_SIZE]))


def test_fp8_and_mixed_dtypes_go_to_the_reference():
    key = torch.randn(2, KV_HEADS, HEAD_DIM)
    slots = torch.tensor([4, 9])
    scale = torch.tensor(0.5)
    fp8 = [
        torch.zeros(BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.float8_e4m3fn)
        for _ in range(4)
    ]
    cache.store_kv(key, key, fp8[0], fp8[1], slots, scale, scale)
    reference.store_kv(key, key, fp8[2], fp8[3], slots, scale, scale)
    assert torch.equal(fp8[0].view(torch.uint8), fp8[2].view(torch.uint8))
    k_c, v_c, k_r, v_r = _caches(torch.bfloat16)  # float32 keys into a bf16 cache
    cache.store_kv(key, key, k_c, v_c, slots)
    reference.store_kv(key, key, k_r, v_r, slots)
    assert torch.equal(k_c, k_r) and torch.equal(v_c, v_r)
