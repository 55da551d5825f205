"""Writing new keys and values into the paged KV cache."""

from __future__ import annotations

import torch
from infernetes.kernels.reference.fp8 import FP8_DTYPES, quantize_to_fp8


def _write(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, scale) -> None:
    flat = cache.view(-1, cache.shape[2], cache.shape[3])
    if cache.dtype in FP8_DTYPES:
        if scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        values = quantize_to_fp8(values, scale, cache.dtype)
        # index_put is not implemented for fp8 everywhere; bytes are bytes.
        flat.view(torch.uint8).index_copy_(0, slots, values.view(torch.uint8))
    else:
        flat.index_copy_(0, slots, values.to(cache.dtype))  # cheaper than an index_put on CPU


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write `key`/`value` `[T, Hkv, D]` at `slot_mapping` `[T]` (slot -1 is skipped)."""
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    _write(k_cache, slots, key, k_scale)
    _write(v_cache, slots, value, v_scale)
