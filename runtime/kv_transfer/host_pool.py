"""HostKVPool: one rank's share of the host-memory KV tier, and the copies in and out of it.

Each attention layer's cache gets a host twin of ``num_blocks`` slots, ``[num_blocks, block_size,
Hkv, D]`` like the device's (a rank holds its own heads' shard, so tensor-parallel ranks each
offload their own part under the one slot numbering the scheduler gives out). On CUDA the twins
are pinned and the copies run on a side stream, each ordered after the work already queued on the
compute stream (the step that wrote the blocks) and marked by an event; on the CPU a copy is done
when its call returns. Consecutive blocks going to consecutive slots move as one copy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from infernetes.runtime.kv_transfer.base import KVCaches


def _runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first source, first destination, length) of the runs both sides advance together."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            first_s, first_d, n = runs[-1]
            runs[-1] = (first_s, first_d, n + 1)
        else:
            runs.append((s, d, 1))
    return runs


class CopyJob:
    """A submitted copy of ``num_blocks`` blocks: done when its call returned on the CPU (which
    timed it), when its end event is reached on CUDA (the events time it)."""

    def __init__(
        self,
        num_blocks: int,
        seconds: float = 0.0,
        events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self._seconds = seconds
        self.events = events

    def done(self) -> bool:
        return self.events is None or self.events[1].query()

    def wait(self) -> None:
        if self.events is not None:
            self.events[1].synchronize()

    @property
    def seconds(self) -> float:
        """How long the copy took (once done)."""
        if self.events is None:
            return self._seconds
        start, end = self.events
        return start.elapsed_time(end) / 1000


class HostKVPool:
    def __init__(self, kv_caches: KVCaches, num_blocks: int) -> None:
        self.device_caches = [
            tensor
            for keys, values in kv_caches.values()
            for tensor in ((keys,) if values is keys else (keys, values))
        ]
        first = self.device_caches[0]
        self.on_cuda = first.device.type == "cuda"
        # (empty: a slot is read only after a store wrote it)
        self.host_caches = [
            torch.empty((num_blocks, *c.shape[1:]), dtype=c.dtype, pin_memory=self.on_cuda)
            for c in self.device_caches
        ]
        self.stream = torch.cuda.Stream(first.device) if self.on_cuda else None
        self.bytes_per_block = sum(c[0].numel() * c.element_size() for c in self.host_caches)

    def store(self, device_blocks: Sequence[int], slots: Sequence[int]) -> CopyJob:
        """Copy device blocks into host slots."""
        return self._copy(self.device_caches, self.host_caches, device_blocks, slots)

    def load(self, slots: Sequence[int], device_blocks: Sequence[int]) -> CopyJob:
        """Copy host slots into device blocks."""
        return self._copy(self.host_caches, self.device_caches, slots, device_blocks)

    def _copy(
        self,
        sources: list[torch.Tensor],
        destinations: list[torch.Tensor],
        src_ids: Sequence[int],
        dst_ids: Sequence[int],
    ) -> CopyJob:
        runs = _runs(src_ids, dst_ids)
        if self.stream is None:
            started = time.perf_counter()
            self._copy_runs(sources, destinations, runs)
            return CopyJob(len(src_ids), time.perf_counter() - started)
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            self._copy_runs(sources, destinations, runs)
            end.record(self.stream)
        return CopyJob(len(src_ids), events=(start, end))

    @staticmethod
    def _copy_runs(
        sources: list[torch.Tensor],
        destinations: list[torch.Tensor],
        runs: list[tuple[int, int, int]],
    ) -> None:
        for source, destination in zip(sources, destinations, strict=True):
            for s, d, n in runs:
                destination[d : d + n].copy_(source[s : s + n], non_blocking=True)

    def fence(self) -> None:
        """Later work on the compute stream waits for every copy submitted so far."""
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
