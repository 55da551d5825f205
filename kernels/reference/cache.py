"""Writing new keys and values into the paged KV cache."""

from __future__ import annotations

import torch
from infernetes.kernels.reference.fp8 import FP8_DTYPES, quantize_to_fp8


def _copy_rows(table: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """`table.index_copy_(0, rows, values)`, as 4-byte words when the row size allows: torch's CPU
    copy is vectorised for float32, a per-element loop for bf16/fp16/fp8. Bit for bit either way."""
    if table.dtype != torch.float32 and table[0].numel() * table.element_size() % 4 == 0:
        table = table.view(table.shape[0], -1).view(torch.float32)
        values = values.reshape(values.shape[0], -1).view(torch.float32)
    table.index_copy_(0, rows, values)


def _write(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, scale) -> None:
    flat = cache.view(-1, cache.shape[2], cache.shape[3])
    if cache.dtype in FP8_DTYPES:
        if scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        values = quantize_to_fp8(values, scale, cache.dtype)
        # index_copy is not implemented for fp8 everywhere; bytes are bytes.
        _copy_rows(flat.view(torch.uint8), slots, values.view(torch.uint8))
    else:
        _copy_rows(flat, slots, values.to(cache.dtype).contiguous())


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
    if slots.numel() == 0:  # every row skipped (a padded batch): nothing to write
        return
    _write(k_cache, slots, key, k_scale)
    _write(v_cache, slots, value, v_scale)
