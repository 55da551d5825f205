"""Writing keys and values into the paged KV cache on the CPU through the C kernel of cache.c:
one call per layer instead of the reference's eight torch ops. Same contract as
`infernetes.kernels.ops.store_kv`; the torch reference runs whenever the kernel is unavailable
or the tensors are outside what it handles (an fp8 cache, which stores ``x / scale``; keys of
another dtype than the cache's)."""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import native
from infernetes.kernels.reference import cache as reference

_ELEMENT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rows_of_heads(x: torch.Tensor, cache: torch.Tensor) -> bool:
    return (
        x.dim() == 3
        and x.dtype == cache.dtype
        and x.stride(2) == 1
        and x.shape[1:] == cache.shape[2:]
    )


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    library = native.load("cache")
    if (
        library is None
        or k_cache.dtype not in _ELEMENT_DTYPES
        or v_cache.dtype != k_cache.dtype
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or k_cache.shape != v_cache.shape
        or not (_rows_of_heads(key, k_cache) and _rows_of_heads(value, v_cache))
        or slot_mapping.dtype != torch.int64
        or not slot_mapping.is_contiguous()
        or slot_mapping.shape[0] != key.shape[0]
        or value.shape[0] != key.shape[0]
    ):
        reference.store_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return
    tokens, heads, head_dim = key.shape
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    bad = library.store_kv(
        key.data_ptr(),
        key.stride(0),
        key.stride(1),
        value.data_ptr(),
        value.stride(0),
        value.stride(1),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        slot_mapping.data_ptr(),
        num_slots,
        tokens,
        heads,
        head_dim,
        k_cache.element_size(),
    )
    if bad >= 0:  # torch's index_copy_ would raise the same
        raise IndexError(
            f"slot_mapping[{bad}] = {int(slot_mapping[bad])} is past the cache's {num_slots} slots"
        )
