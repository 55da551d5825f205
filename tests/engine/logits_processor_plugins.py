"""``--logits-processors`` classes the tests load by name, written as a user would write one
against ``infernetes.runtime.logits_processor``."""

from __future__ import annotations

import torch
from infernetes.runtime.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class ForceToken(LogitsProcessor):
    """Each request with ``extra_args["force"]`` (a token id) generates only that token."""

    @classmethod
    def validate_params(cls, sampling_params):
        force = (sampling_params.extra_args or {}).get("force")
        if force is not None and not isinstance(force, int):
            raise ValueError(f"force must be a token id, got {force!r}")

    def __init__(self, vllm_config, device, is_pin_memory):
        self.forced: dict[int, int] = {}  # batch row -> token

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.forced.pop(row, None)
        for row, params, _prompt, _output in batch_update.added:
            force = (params.extra_args or {}).get("force")
            self.forced.pop(row, None)
            if force is not None:
                self.forced[row] = force
        for a, b, direction in batch_update.moved:
            first, second = self.forced.pop(a, None), self.forced.pop(b, None)
            if first is not None:
                self.forced[b] = first
            if second is not None and direction is MoveDirectionality.SWAP:
                self.forced[a] = second
        assert all(row < batch_update.batch_size for row in self.forced)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.forced.items():
            logits[row] = float("-inf")
            logits[row, token] = 0.0
        return logits


class RowLog:
    """Not a subclass: any class of the same shape is taken. Records each step's output ids."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.outputs: dict[int, object] = {}

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update):
        if batch_update is not None:
            for row, _params, _prompt, output in batch_update.added:
                self.outputs[row] = output

    def apply(self, logits):
        return logits


class NotAProcessor:
    def apply(self, logits):
        return logits
