"""The reference kernels' row copies (KV gather and store) are bit-for-bit, whatever the dtype,
and the per-step attention plan follows the metadata it is given."""

from __future__ import annotations

import pytest
import torch
from infernetes.kernels.reference import attention, cache


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32, torch.uint8]
)  # fp8 caches go as uint8
@pytest.mark.parametrize("row_shape", [(2, 4), (1, 3)])  # 4-byte words, and a fallback size
def test_take_rows_and_copy_rows_are_bitwise(dtype, row_shape):
    table = torch.randint(0, 100, (20, *row_shape)).to(dtype)
    table.view(torch.uint8)[3] = 0xFF  # NaN bit patterns copy unchanged
    rows = torch.tensor([3, 0, 19, 3, 7])
    taken = attention.take_rows(table, rows)
    assert taken.dtype == dtype and taken.shape == (5, *row_shape)
    assert torch.equal(taken.view(torch.uint8), table.view(torch.uint8)[rows])

    target = torch.zeros(20, *row_shape, dtype=dtype)
    cache._copy_rows(target, torch.tensor([5, 1]), table[[3, 19]])
    assert torch.equal(target.view(torch.uint8)[[5, 1]], table.view(torch.uint8)[[3, 19]])
    assert not target.view(torch.uint8)[[0, 2, 3, 4]].any()


def test_plan_is_rebuilt_when_the_metadata_changes():
    torch.manual_seed(0)
    k_cache = torch.randn(8, 4, 2, 8)
    v_cache = torch.randn(8, 4, 2, 8)
    query = torch.randn(2, 2, 8)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    first = attention.paged_attention(
        query, k_cache, v_cache, tables, cu, torch.tensor([5, 3], dtype=torch.int32), 0.3
    )
    second = attention.paged_attention(
        query, k_cache, v_cache, tables, cu, torch.tensor([2, 8], dtype=torch.int32), 0.3
    )
    k = k_cache[tables[1].long()].reshape(-1, 2, 8)  # row 1 now sees all 8 tokens of its 2 blocks
    v = v_cache[tables[1].long()].reshape(-1, 2, 8)
    weights = torch.softmax(torch.einsum("hd,lhd->hl", query[1], k) * 0.3, dim=-1)
    torch.testing.assert_close(second[1], torch.einsum("hl,lhd->hd", weights, v))
    assert not torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_store_kv_with_every_slot_skipped_writes_nothing(dtype):
    k_cache = torch.zeros(4, 2, 1, 8, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    key = torch.ones(3, 1, 8, dtype=dtype)
    cache.store_kv(key, key, k_cache, v_cache, torch.tensor([-1, -1, -1]))
    assert not k_cache.any() and not v_cache.any()
