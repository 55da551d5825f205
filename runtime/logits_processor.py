"""``--logits-processors``: user classes loaded at startup and applied to every step's batch, in
the shape of vLLM V1's ``LogitsProcessor`` interface (vLLM 0.10.2 and later).

A class named on the command line is built once in each worker as
``cls(config, device, is_pin_memory)`` (``config`` is this server's ``RuntimeConfig``, not a
``VllmConfig``). Before each step that changed the batch it gets ``update_state(BatchUpdate)``:
the rows removed, the requests added (row, ``SamplingParams``, prompt ids, a live view of the
output ids) and the rows moved; then ``apply(logits)`` over the batch's ``[rows, vocab]`` logits.
A request's own arguments reach it as ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP),
and a class's ``validate_params(params)`` classmethod, where it has one, refuses a request's bad
arguments before it is queued (a 400).

vLLM is not part of this server, so a class that subclasses vLLM's ``LogitsProcessor`` cannot be
imported here: write it against the ``LogitsProcessor``, ``BatchUpdate`` and
``MoveDirectionality`` of this module (the same names, fields and methods), or any class with
those methods. Classes are named by their qualified name (``module.Class`` or
``module:Class``); vLLM's entry-point plugins are not searched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

from infernetes.runtime.qualified_import import import_qualified
from infernetes.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

FLAG = "--logits-processors"


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()  # the request at the first row moves to the second
    SWAP = auto()  # the two rows swap requests


# (row, params, prompt token ids, output token ids: grows as the request generates)
AddedRequest = tuple[int, SamplingParams, Sequence[int] | None, Sequence[int]]
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(frozen=True)
class BatchUpdate:
    """How the batch changed since the last step: apply ``removed``, then ``added`` (into free
    rows), then ``moved``, as vLLM's processors do."""

    batch_size: int
    removed: Sequence[int]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """The interface a ``--logits-processors`` class implements."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ValueError for a request whose arguments this processor refuses."""
        return None  # takes every request unless a processor says otherwise

    @abstractmethod
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None: ...

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The batch's processed logits (``logits`` may be changed in place)."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """Whether it never changes a row's most likely token."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Learn what changed in the batch (None: nothing)."""


REQUIRED_METHODS = ("apply", "is_argmax_invariant", "update_state")


def load_logits_processor_classes(names: Sequence[str]) -> list[type]:
    """The classes ``--logits-processors`` names; ValueError naming the first that is not one."""
    classes = []
    for name in names:
        target = import_qualified(FLAG, name)
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(target, m, None))]
        if not isinstance(target, type) or missing:
            raise ValueError(
                f"{FLAG} {name!r} is not a logits processor class: one needs "
                f"{', '.join(REQUIRED_METHODS)} (infernetes.runtime.logits_processor."
                "LogitsProcessor's interface)"
            )
        classes.append(target)
    return classes


def validate_request(classes: Sequence[type], params: SamplingParams) -> None:
    """Each class's ``validate_params`` of a request (those that have one)."""
    for cls in classes:
        validate = getattr(cls, "validate_params", None)
        if callable(validate):
            validate(params)
