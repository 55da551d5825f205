"""The attention metadata of the step being run, set by the ModelRunner around each forward.

Layers read it from here rather than through every forward signature (nano-vllm's shape), which
keeps model code plain and lets a CUDA graph capture the forward with fixed tensors later.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from infernetes.runtime.kv_transfer.base import KVConnectorBase


class CrossAttentionBatch(NamedTuple):
    """An encoder-decoder step's (Whisper's): each sequence's rows of the step, in order, and
    its encoder output's keys and values per decoder layer (``[heads, frames, head_dim]``)."""

    query_lens: list[int]
    keys_values: list[list[tuple[torch.Tensor, torch.Tensor]]]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: where each new token's key/value goes; -1 skips
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32: query tokens of sequence b are [cu[b], cu[b+1])
    seq_lens: torch.Tensor  # [B] int32: cached tokens including this step's
    calculate_kv_scales: bool = False
    # The KV connector's worker side, which each attention layer calls (a step's, not a graph's)
    kv_connector: KVConnectorBase | None = None
    # Image tokens that see their whole image (Gemma 3): (seq, first_row, end_row,
    # first_position, image_end) per image the step computes rows of (ops.attend_within_images)
    image_spans: list[tuple[int, int, int, int, int]] | None = None
    cross_attention: CrossAttentionBatch | None = None


# Per thread: a forward runs in the thread that set its metadata, and two engines in one process
# (async scheduling runs each on its own thread) must not clear each other's step.
_local = threading.local()


def set_attention_metadata(metadata: AttentionMetadata | None) -> None:
    _local.current = metadata


def get_attention_metadata() -> AttentionMetadata:
    current = getattr(_local, "current", None)
    if current is None:
        raise RuntimeError("attention ran outside a ModelRunner step (no attention metadata set)")
    return current
