"""A step's flat inputs from state kept across steps (vLLM V1's persistent batch, in small).

Each request the worker runs has a row of one int32 block table (``BlockTable``): a step writes
only the blocks the scheduler added, and a batch's table is one gather of its rows instead of a
table rebuilt from lists. ``step_inputs`` derives positions, slots, query offsets and sequence
lengths from that table and the requests' computed-token counts with array operations (no loop
over tokens), and ``StepBuffers`` hands them to the device in two copies (one int64, one int32
buffer) into buffers kept across steps, of which the step's tensors are views.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from infernetes.runtime.worker.request_state import CachedRequestState


class BlockTable:
    """Every running request's KV block ids, a row each; rows past a request's blocks are 0."""

    def __init__(self, max_blocks_per_row: int, rows: int = 16) -> None:
        self.width = max_blocks_per_row
        self.table = np.zeros((rows, max_blocks_per_row), np.int32)
        self.num_blocks = np.zeros(rows, np.int64)
        self._free = list(range(rows - 1, -1, -1))

    def add(self, block_ids: Sequence[int]) -> int:
        """A row for a new request holding ``block_ids``."""
        if not self._free:  # more requests than rows: twice the rows
            rows = len(self.num_blocks)
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.num_blocks = np.concatenate([self.num_blocks, np.zeros_like(self.num_blocks)])
            self._free = list(range(2 * rows - 1, rows - 1, -1))
        row = self._free.pop()
        self.set(row, block_ids)
        return row

    def set(self, row: int, block_ids: Sequence[int]) -> None:
        """Replace the row's blocks (a request resumed after preemption)."""
        self._fit(len(block_ids))
        self.table[row, : self.num_blocks[row]] = 0
        self.table[row, : len(block_ids)] = block_ids
        self.num_blocks[row] = len(block_ids)

    def append(self, row: int, block_ids: Sequence[int]) -> None:
        start = int(self.num_blocks[row])
        self._fit(start + len(block_ids))
        self.table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def remove(self, row: int) -> None:
        self.table[row, : self.num_blocks[row]] = 0
        self.num_blocks[row] = 0
        self._free.append(row)

    def blocks(self, row: int) -> list[int]:
        return self.table[row, : self.num_blocks[row]].tolist()

    def _fit(self, count: int) -> None:
        if count > self.width:  # not expected (max_model_len bounds a request): widen
            extra = np.zeros((len(self.table), count - self.width), np.int32)
            self.table = np.concatenate([self.table, extra], axis=1)
            self.width = count


@dataclass
class StepInputs:
    """A step's inputs on the host: ``[T]`` int64 (positions ``[3, T]`` under M-RoPE) and
    ``[B]``/``[B + 1]``/``[B, W]`` int32."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    cu_seqlens_q: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray


def step_inputs(
    batch: Sequence[CachedRequestState],
    num_scheduled: Sequence[int],
    table: BlockTable,
    block_size: int,
    shift: int = 0,
) -> StepInputs:
    """Each scheduled token's id, position and cache slot, and each request's query range,
    length and block-table row; a request computes tokens ``num_computed_tokens ..`` onward.
    ``shift``: each position takes the id of the token that many places after it (an EAGLE head
    pairs a position's hidden state with the token that follows)."""
    count = len(batch)
    rows = np.fromiter((r.row for r in batch), np.int64, count)
    starts = np.fromiter((r.num_computed_tokens for r in batch), np.int64, count)
    num_new = np.asarray(num_scheduled, np.int64).reshape(count)
    cu_seqlens = np.zeros(count + 1, np.int32)
    np.cumsum(num_new, out=cu_seqlens[1:])
    total = int(cu_seqlens[-1])
    if total == count:  # every row decodes one token, the common case
        positions = starts
        token_rows = rows
        input_ids = [r.token_ids[s + shift] for r, s in zip(batch, starts.tolist(), strict=True)]
    else:
        which = np.repeat(np.arange(count), num_new)
        positions = np.arange(total) - cu_seqlens[:-1][which] + starts[which]
        token_rows = rows[which]
        input_ids = list(
            itertools.chain.from_iterable(
                r.token_ids[s + shift : s + shift + n]
                for r, s, n in zip(batch, starts.tolist(), num_scheduled, strict=True)
            )
        )
    return StepInputs(
        input_ids=np.asarray(input_ids, np.int64).reshape(total),
        positions=positions,
        slot_mapping=_slots(table, token_rows, positions, block_size),
        cu_seqlens_q=cu_seqlens,
        seq_lens=(starts + num_new).astype(np.int32),
        block_tables=_rows_of(table, rows),
    )


def decode_inputs(
    rows: np.ndarray,
    positions: np.ndarray,
    input_ids: np.ndarray,
    table: BlockTable,
    block_size: int,
) -> StepInputs:
    """One token a request: ``input_ids[i]`` at ``positions[i]`` of the request in block-table
    row ``rows[i]`` (a draft model's guesses, fed back one position at a time)."""
    count = len(rows)
    return StepInputs(
        input_ids=input_ids.astype(np.int64),
        positions=positions.astype(np.int64),
        slot_mapping=_slots(table, rows, positions, block_size),
        cu_seqlens_q=np.arange(count + 1, dtype=np.int32),
        seq_lens=(positions + 1).astype(np.int32),
        block_tables=_rows_of(table, rows),
    )


def _slots(
    table: BlockTable, token_rows: np.ndarray, positions: np.ndarray, block_size: int
) -> np.ndarray:
    blocks = table.table[token_rows, positions // block_size].astype(np.int64)
    return blocks * block_size + positions % block_size


def _rows_of(table: BlockTable, rows: np.ndarray) -> np.ndarray:
    width = int(table.num_blocks[rows].max()) if len(rows) else 0
    return table.table[rows, :width]


class StepBuffers:
    """The step's tensors on the device: the host arrays packed into one int64 and one int32
    buffer, each copied at once into a device buffer kept across steps and grown when a step
    needs more; the step's tensors are views of those. On the CPU the arrays are wrapped as
    they are (``persistent=False``): a copy would only cost."""

    def __init__(self, device: torch.device, persistent: bool) -> None:
        self.device = device
        self.persistent = persistent
        self._long = torch.empty(0, dtype=torch.int64, device=device)
        self._int = torch.empty(0, dtype=torch.int32, device=device)

    def stage(
        self, inputs: StepInputs
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, positions, slot_mapping, cu_seqlens_q, seq_lens, block_tables)``."""
        longs = (inputs.input_ids, inputs.positions, inputs.slot_mapping)
        ints = (inputs.cu_seqlens_q, inputs.seq_lens, inputs.block_tables)
        if not self.persistent:
            return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in longs + ints)  # type: ignore[return-value]  # six tensors
        self._long = self._copied(np.concatenate([a.reshape(-1) for a in longs]), self._long)
        self._int = self._copied(np.concatenate([a.reshape(-1) for a in ints]), self._int)
        return (*_split(self._long, longs), *_split(self._int, ints))  # type: ignore[return-value]  # six tensors

    def _copied(self, host: np.ndarray, buffer: torch.Tensor) -> torch.Tensor:
        if buffer.numel() < host.size:
            buffer = torch.empty(
                max(host.size, 2 * buffer.numel()), dtype=buffer.dtype, device=self.device
            )
        # From pageable memory: the copy has read the host array when it returns.
        buffer[: host.size].copy_(torch.from_numpy(host))
        return buffer


def _split(buffer: torch.Tensor, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
    views, offset = [], 0
    for array in arrays:
        views.append(buffer[offset : offset + array.size].view(array.shape))
        offset += array.size
    return views


def image_spans(
    batch: Sequence[CachedRequestState], num_scheduled: Sequence[int]
) -> list[tuple[int, int, int, int, int]]:
    """The step's rows of image tokens for a model whose image tokens see their whole image
    (``AttentionMetadata.image_spans``): ``(seq, first_row, end_row, first_position,
    image_end)``. The scheduler never ends a chunk inside an image, so every image the step
    computes rows of has all its keys in the step or before it."""
    spans = []
    row = 0
    for seq, (request, num_new) in enumerate(zip(batch, num_scheduled, strict=True)):
        first, end = request.num_computed_tokens, request.num_computed_tokens + num_new
        for feature in request.mm_features:
            start = max(first, feature.offset)
            if start < min(end, feature.end):
                if end < feature.end:
                    raise RuntimeError(
                        f"a chunk ends inside an image (positions {feature.offset}-"
                        f"{feature.end - 1}) of a model whose image tokens see the whole image"
                    )
                spans.append(
                    (seq, row + start - first, row + feature.end - first, start, feature.end)
                )
        row += num_new
    return spans
