"""RMSNorm, rotary embedding and SiLU-and-mul on the CPU through the C kernels of elementwise.c:
one call per op instead of the reference's five to fifteen torch ops, with the reference's
rounding. Same contracts as `infernetes.kernels.ops`; the torch reference runs whenever the
kernels are unavailable or the tensors are outside what they handle."""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import native
from infernetes.kernels.reference import activation as _ref_activation
from infernetes.kernels.reference import norm as _ref_norm
from infernetes.kernels.reference import rotary as _ref_rotary

_DTYPE_CODES = native.DTYPE_CODES


def _library():
    return native.load("elementwise")


def _rows(x: torch.Tensor) -> bool:
    """A 2-D tensor whose rows are contiguous (a row stride of its own is fine)."""
    return x.dim() == 2 and x.stride(1) == 1 and x.dtype in _DTYPE_CODES


def _check(status: int, op: str) -> None:
    if status != 0:
        raise MemoryError(f"{op}: the CPU kernel could not allocate its scratch memory")


def rms_norm(x, weight, eps, residual=None):
    library = _library()
    if (
        library is None
        or not _rows(x)
        or weight.dtype != x.dtype
        or not weight.is_contiguous()
        or (
            residual is not None
            and (not _rows(residual) or residual.dtype != x.dtype or residual.shape != x.shape)
        )
    ):
        return _ref_norm.rms_norm(x, weight, eps, residual)
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=x.dtype)
    summed = torch.empty_like(out) if residual is not None else None
    _check(
        library.rms_norm(
            x.data_ptr(),
            x.stride(0),
            residual.data_ptr() if residual is not None else None,
            residual.stride(0) if residual is not None else 0,
            weight.data_ptr(),
            out.data_ptr(),
            summed.data_ptr() if summed is not None else None,
            rows,
            hidden,
            eps,
            _DTYPE_CODES[x.dtype],
        ),
        "rms_norm",
    )
    return out if residual is None else (out, summed)


def rotary_embedding(positions, query, key, cos_sin_cache, is_neox):
    library = _library()
    if (
        library is None
        or query.dim() != 3
        or key.dim() != 3
        or query.dtype not in _DTYPE_CODES
        or key.dtype != query.dtype
        or query.stride(2) != 1
        or key.stride(2) != 1
        or cos_sin_cache.dtype != torch.float32
        or not cos_sin_cache.is_contiguous()
        or positions.dtype != torch.int64
        or not positions.is_contiguous()
        or query.shape[-1] != key.shape[-1]
    ):
        return _ref_rotary.rotary_embedding(positions, query, key, cos_sin_cache, is_neox)
    tokens, q_heads, head_dim = query.shape
    q_out = torch.empty((tokens, q_heads, head_dim), dtype=query.dtype)
    k_out = torch.empty((tokens, key.shape[1], head_dim), dtype=key.dtype)
    _check(
        library.rotary_embedding(
            positions.data_ptr(),
            cos_sin_cache.data_ptr(),
            cos_sin_cache.stride(0),
            query.data_ptr(),
            query.stride(0),
            query.stride(1),
            q_heads,
            key.data_ptr(),
            key.stride(0),
            key.stride(1),
            key.shape[1],
            q_out.data_ptr(),
            k_out.data_ptr(),
            tokens,
            head_dim,
            cos_sin_cache.shape[1],
            int(is_neox),
            _DTYPE_CODES[query.dtype],
        ),
        "rotary_embedding",
    )
    return q_out, k_out


def silu_and_mul(x):
    library = _library()
    if library is None or not _rows(x):
        return _ref_activation.silu_and_mul(x)
    rows, width = x.shape
    out = torch.empty((rows, width // 2), dtype=x.dtype)
    _check(
        library.silu_and_mul(
            x.data_ptr(), x.stride(0), out.data_ptr(), rows, width // 2, _DTYPE_CODES[x.dtype]
        ),
        "silu_and_mul",
    )
    return out
