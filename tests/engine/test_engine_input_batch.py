"""The persistent batch: block-table rows kept across steps, a step's inputs derived from them
with array operations, and the device buffers they are copied into."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from infernetes.runtime.worker.input_batch import BlockTable, StepBuffers, step_inputs
from infernetes.runtime.worker.request_state import CachedRequestState

BLOCK = 4


def _expected(batch, num_scheduled, blocks_of):
    """Token by token, as the loop over rows computed them."""
    ids, positions, slots, cu, lens = [], [], [], [0], []
    for request, n in zip(batch, num_scheduled, strict=True):
        blocks = blocks_of[request.request_id]
        for p in range(request.num_computed_tokens, request.num_computed_tokens + n):
            ids.append(request.token_ids[p])
            positions.append(p)
            slots.append(blocks[p // BLOCK] * BLOCK + p % BLOCK)
        cu.append(cu[-1] + n)
        lens.append(request.num_computed_tokens + n)
    width = max(len(blocks_of[r.request_id]) for r in batch)
    tables = np.zeros((len(batch), width), np.int32)
    for i, r in enumerate(batch):
        tables[i, : len(blocks_of[r.request_id])] = blocks_of[r.request_id]
    return ids, positions, slots, cu, lens, tables


@pytest.mark.parametrize("seed", range(6))
def test_step_inputs_equal_the_token_by_token_ones(seed):
    """Mixed steps (prompt chunks, decode rows, a whole-prompt row) over rows that were added,
    grown, replaced (a resumed request) and freed and reused."""
    rng = random.Random(seed)
    table = BlockTable(max_blocks_per_row=64, rows=2)  # grows under the requests below
    states: dict[str, CachedRequestState] = {}
    blocks_of: dict[str, list[int]] = {}
    next_block = 0

    def take(count):
        nonlocal next_block
        next_block += count
        return list(range(next_block - count, next_block))

    for step in range(8):
        for request_id in [r for r in states if rng.random() < 0.2]:  # finished
            table.remove(states.pop(request_id).row)
        for _ in range(rng.randint(0, 3)):  # new
            request_id = f"s{step}-{len(states)}"
            length = rng.randint(1, 40)
            blocks_of[request_id] = take(-(-length // BLOCK))
            states[request_id] = CachedRequestState(
                request_id,
                [rng.randrange(1000) for _ in range(length)],
                length,
                None,
                None,
                table.add(blocks_of[request_id]),
                rng.randint(0, length - 1),
            )
        for request_id, state in states.items():  # decode growth, or a resumed request
            if rng.random() < 0.3:
                blocks_of[request_id] = take(len(blocks_of[request_id]))
                table.set(state.row, blocks_of[request_id])
            elif rng.random() < 0.5:
                state.token_ids += [rng.randrange(1000) for _ in range(2 * BLOCK)]
                added = take(2)
                blocks_of[request_id] += added
                table.append(state.row, added)
        if not states:
            continue
        batch = list(states.values())
        rng.shuffle(batch)  # the scheduler's order, not the rows'
        num_scheduled = [
            rng.randint(1, len(r.token_ids) - r.num_computed_tokens) if rng.random() < 0.5 else 1
            for r in batch
        ]
        got = step_inputs(batch, num_scheduled, table, BLOCK)
        ids, positions, slots, cu, lens, tables = _expected(batch, num_scheduled, blocks_of)
        assert got.input_ids.tolist() == ids
        assert got.positions.tolist() == positions
        assert got.slot_mapping.tolist() == slots
        assert got.cu_seqlens_q.tolist() == cu
        assert got.seq_lens.tolist() == lens
        np.testing.assert_array_equal(got.block_tables, tables)  # zeros past each row's blocks


def test_block_table_reuses_freed_rows_and_grows():
    table = BlockTable(max_blocks_per_row=2, rows=1)
    first = table.add([7, 8])
    second = table.add([9])  # past the one row: twice the rows
    assert first != second and table.blocks(second) == [9]
    table.append(second, [10, 11])  # past the width: wider
    assert table.blocks(second) == [9, 10, 11] and table.blocks(first) == [7, 8]
    table.remove(first)
    assert not table.table[first].any()
    assert table.add([3]) == first and table.blocks(first) == [3]
    table.set(second, [4])  # resumed after preemption with fewer blocks
    assert table.table[second].tolist() == [4, 0, 0]


def test_persistent_buffers_hold_the_step_as_views():
    """The device path: one int64 and one int32 copy into buffers kept across steps, the step's
    tensors views of them, a larger step growing them."""
    table = BlockTable(max_blocks_per_row=8)
    requests = [
        CachedRequestState(
            f"r{i}",
            list(range(10 + i, 30 + i)),
            20,
            None,
            None,
            table.add(list(range(5 * i, 5 * i + 5))),
            16 - i,
        )
        for i in range(3)
    ]
    buffers = StepBuffers(torch.device("cpu"), persistent=True)

    def staged(num_scheduled):
        inputs = step_inputs(requests, num_scheduled, table, BLOCK)
        tensors = buffers.stage(inputs)
        for tensor, array in zip(tensors, vars(inputs).values(), strict=True):
            assert tensor.dtype == torch.from_numpy(np.asarray(array)).dtype
            np.testing.assert_array_equal(tensor.numpy(), array)
        return tensors

    big = staged([2, 2, 2])
    long_buffer = big[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == long_buffer for t in big[:3])
    small = staged([1, 1, 1])  # fits: the same buffers, written in place
    assert small[0].untyped_storage().data_ptr() == long_buffer
    assert small[3].untyped_storage().data_ptr() == big[3].untyped_storage().data_ptr()
    staged([2, 3, 4])  # more tokens than before: a larger buffer
