"""Linear layers of few rows (decode) on dense float32/bfloat16 weights on the CPU, through the C
kernel of skinny_linear.c, which streams each weight row once per call over all threads.

On an AMD EPYC torch's float32 product of one row ran on one thread (MKL's GEMV; aten::mm was
87% of a decode step and read the weights at a quarter of the copy bandwidth on 2 cores); the
kernel splits the rows between the threads. On Intel CPUs MKL's GEMV reads faster than the
kernel, and a single float32 row stays with it (`handles`). bfloat16 weights packed for oneDNN
stay there (oneDNN spreads a row's product over the threads and reads as fast:
bench/cpu_gemv.py); the kernel takes bf16 ones only where oneDNN cannot pack them. Above
``MAX_ROWS`` rows the product is bound by arithmetic and torch's GEMM wins. Same contract as ``F.linear``; callers fall back to torch where
`handles` says no.
"""

from __future__ import annotations

import torch
from infernetes.kernels.cpu import native

_DTYPE_CODES = native.dtype_codes(torch.float32, torch.bfloat16)
MAX_ROWS = 8  # decode batches; more rows go to torch's GEMM (bench/cpu_gemv.py)


def _library():
    return native.load("skinny_linear")


def built() -> bool:
    """Whether the kernel is built here (a C compiler was found)."""
    return _library() is not None


def handles(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel computes ``F.linear(x, weight)``: a plain contiguous CPU weight of
    x's dtype (float32 or bfloat16), at most ``MAX_ROWS`` rows, and the kernel built. A single
    float32 row stays with torch where MKL is made for the CPU (Intel's): its GEMV read at
    110-120% of the copy bandwidth there, the kernel at 90-105% (``bench cpu_gemv``)."""
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        weight.device.type == "cpu"
        and weight.dtype in _DTYPE_CODES
        and x.dtype == weight.dtype
        and weight.dim() == 2
        and x.shape[-1] == weight.shape[1]
        and weight.is_contiguous()
        and 0 < rows <= MAX_ROWS
        and not (rows == 1 and x.dtype == torch.float32 and native.mkl_tuned_here())
        and not torch.compiler.is_compiling()
        and built()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs `handles` accepts; `x` is ``[..., K]``."""
    rows_x = x.reshape(-1, x.shape[-1])
    if rows_x.stride(-1) != 1:
        rows_x = rows_x.contiguous()
    rows, outputs = rows_x.shape[0], weight.shape[0]
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    out = torch.empty((rows, outputs), dtype=x.dtype)
    status = _library().skinny_linear(
        rows_x.data_ptr(),
        rows_x.stride(0),
        out.data_ptr(),
        out.stride(0),
        weight.data_ptr(),
        bias.data_ptr() if bias is not None else None,
        _DTYPE_CODES[x.dtype],
        rows,
        outputs,
        weight.shape[1],
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("skinny_linear: the CPU kernel could not allocate its scratch")
    return out.view(*x.shape[:-1], outputs)
