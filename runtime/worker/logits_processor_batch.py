"""The ``--logits-processors`` of one worker over its steps' batches.

vLLM's processors keep state by row of a persistent batch and learn of each change as a
``BatchUpdate``. The worker's sampler rows are the requests that sample this step, in the
scheduler's order; this keeps the rows those requests would hold in vLLM's persistent batch
(a new request takes the lowest free row, and the batch is kept dense by moving the last rows
into the gaps), tells the processors what changed, and hands them the logits in that row order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from infernetes.runtime.logits_processor import (
    AddedRequest,
    BatchUpdate,
    MoveDirectionality,
    MovedRequest,
    load_logits_processor_classes,
)
from infernetes.runtime.worker.request_state import CachedRequestState


class OutputTokens(Sequence[int]):
    """A request's output token ids as they grow (vLLM hands processors a live list)."""

    def __init__(self, request: CachedRequestState) -> None:
        self.request = request

    def __len__(self) -> int:
        return self.request.num_output_tokens

    def __getitem__(self, index: Any) -> Any:
        return self.request.output_token_ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.request.output_token_ids)


class LogitsProcessorBatch:
    def __init__(self, processors: Sequence[Any]) -> None:
        self.processors = list(processors)
        self.rows: list[str] = []  # request id at each row of the persistent batch

    @classmethod
    def load(cls, names: Sequence[str], config: Any, device: torch.device) -> LogitsProcessorBatch:
        pin = device.type == "cuda"
        return cls([proc(config, device, pin) for proc in load_logits_processor_classes(names)])

    def apply(self, logits: torch.Tensor, requests: Sequence[CachedRequestState]) -> torch.Tensor:
        """``logits`` (a row per request of ``requests``) through every processor."""
        update = self._update(requests)
        for processor in self.processors:
            processor.update_state(update)
        where = {request_id: row for row, request_id in enumerate(self.rows)}
        order = torch.tensor([where[r.request_id] for r in requests], device=logits.device)
        batch = torch.empty_like(logits)
        batch[order] = logits
        for processor in self.processors:
            batch = processor.apply(batch)
        return batch[order]

    def _update(self, requests: Sequence[CachedRequestState]) -> BatchUpdate | None:
        current = {r.request_id for r in requests}
        rows: list[str | None] = [i if i in current else None for i in self.rows]
        free = [row for row, request_id in enumerate(rows) if request_id is None]
        held = set(self.rows)
        added: list[AddedRequest] = []
        for request in requests:
            if request.request_id in held:
                continue
            # The lowest free row (a row taken again is not reported removed, as in vLLM).
            row = free.pop(0) if free else len(rows)
            if row == len(rows):
                rows.append(None)
            rows[row] = request.request_id
            assert request.sampling_params is not None
            added.append(
                (row, request.sampling_params, request.prompt_token_ids, OutputTokens(request))
            )
        removed = free
        moved: list[MovedRequest] = []
        while True:  # dense again: the last request fills the first gap
            while rows and rows[-1] is None:
                rows.pop()
            if None not in rows:
                break
            gap = rows.index(None)
            moved.append((len(rows) - 1, gap, MoveDirectionality.UNIDIRECTIONAL))
            rows[gap] = rows.pop()
        self.rows = [request_id for request_id in rows if request_id is not None]
        if not (removed or added or moved):
            return None
        return BatchUpdate(len(self.rows), removed, added, moved)
