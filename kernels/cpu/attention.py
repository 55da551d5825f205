"""Paged attention on the CPU: decode rows through the C kernel that reads the cache in place,
prefill rows through the torch reference (they run once per request, decode runs every step).

Falls back to the torch reference as a whole when the C kernel is unavailable (no compiler,
``INFERNETES_CPU_KERNELS=0``) or the tensors are outside what it handles.
"""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import native
from infernetes.kernels.reference import attention as reference
from infernetes.kernels.reference.fp8 import FP8_DTYPES

_DTYPE_CODES = native.DTYPE_CODES
_BYTE_TABLE = 3
_byte_tables: dict[torch.dtype, torch.Tensor] = {}


def _byte_table(dtype: torch.dtype) -> torch.Tensor:
    """float32 value of each of the 256 bit patterns of a one-byte dtype (fp8)."""
    if dtype not in _byte_tables:
        _byte_tables[dtype] = torch.arange(256, dtype=torch.uint8).view(dtype).float().contiguous()
    return _byte_tables[dtype]


def _native_decode_ok(query, k_cache, v_cache, block_tables, seq_lens) -> bool:
    return (
        query.dtype in _DTYPE_CODES
        and (k_cache.dtype in _DTYPE_CODES or k_cache.dtype in FP8_DTYPES)
        and query.stride(2) == 1
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and v_cache.dtype == k_cache.dtype
        and block_tables.dtype == torch.int32
        and block_tables.stride(1) == 1
        and seq_lens.dtype == torch.int32
        and seq_lens.is_contiguous()
    )


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `infernetes.kernels.ops.paged_attention`, for CPU tensors. Sliding
    windows, soft-capping and sinks go through the reference (the C kernel has none of them)."""
    library = native.load("paged_decode")
    if (
        library is None
        or sliding_window
        or softcap
        or sinks is not None
        or not _native_decode_ok(query, k_cache, v_cache, block_tables, seq_lens)
    ):
        return reference.paged_attention(
            query,
            k_cache,
            v_cache,
            block_tables,
            cu_seqlens_q,
            seq_lens,
            scale,
            k_scale,
            v_scale,
            sliding_window,
            softcap,
            sinks,
        )
    out = torch.empty(query.shape, dtype=query.dtype)
    plan = None
    rows: torch.Tensor | None
    seqs: torch.Tensor | None
    if query.shape[0] == seq_lens.shape[0]:
        # One query row per sequence, all decode (a padding row's length is 0, which the kernel
        # answers with zeros): no plan, so nothing read on the host (a replayed step reads none).
        rows = seqs = _first_rows(query.shape[0])
    else:
        plan = reference.step_plan(block_tables, cu_seqlens_q, seq_lens, k_cache.shape[1])
        if plan.padding_rows is not None:  # padding rows: nothing to attend to
            out[plan.padding_rows] = 0
        rows, seqs = plan.decode_rows, plan.decode_seqs
    if rows is not None:
        _decode(
            library,
            query,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            rows,
            seqs,
            scale,
            k_scale,
            v_scale,
            out,
        )
    if plan is not None:
        reference.attend_prefills(query, k_cache, v_cache, plan, scale, k_scale, v_scale, out)
    return out


_identity = torch.arange(256, dtype=torch.int32)


def _first_rows(n: int) -> torch.Tensor:
    """``arange(n)`` as int32, a decode batch's query rows and sequences: a slice of one kept
    tensor (a view, so a replayed step computes nothing for it)."""
    global _identity
    if n > _identity.shape[0]:
        _identity = torch.arange(2 * n, dtype=torch.int32)
    return _identity[:n]


def _decode(
    library,
    query,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    rows,
    seqs,
    scale,
    k_scale,
    v_scale,
    out,
) -> None:
    if k_cache.dtype in FP8_DTYPES:
        if k_scale is None or v_scale is None:
            raise ValueError("an fp8 KV cache needs k_scale and v_scale")
        kv_code, table = _BYTE_TABLE, _byte_table(k_cache.dtype)
        scales = (float(k_scale), float(v_scale))
        table_p = table.data_ptr()
    else:
        kv_code, scales, table_p = _DTYPE_CODES[k_cache.dtype], (1.0, 1.0), None
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    status = library.paged_decode_attention(
        query.data_ptr(),
        query.stride(0),
        query.stride(1),
        _DTYPE_CODES[query.dtype],
        out.data_ptr(),
        out.stride(0),
        out.stride(1),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        kv_code,
        table_p,
        scales[0],
        scales[1],
        block_tables.data_ptr(),
        block_tables.stride(0),
        seq_lens.data_ptr(),
        rows.data_ptr(),
        seqs.data_ptr(),
        rows.shape[0],
        query.shape[1],
        num_kv_heads,
        head_dim,
        block_size,
        scale,
    )
    if status != 0:
        raise MemoryError("paged decode attention could not allocate its scratch memory")
