"""What the Triton kernels share: block sizes, the dtype the matmuls run in, interpreter checks."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import triton
import triton.language as tl
from infernetes.kernels import backend

TL_DTYPES = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}


def interpreting() -> bool:
    """Whether the kernels of this process run in Triton's interpreter.

    Triton fixes that when a kernel module is imported, so a process that imported the kernels
    before setting TRITON_INTERPRET cannot switch afterwards: we say so instead of crashing.
    """
    interpreted = _kernels_interpreted()
    if interpreted != backend.interpreter_enabled():
        raise backend.BackendError(
            "TRITON_INTERPRET changed after the Triton kernels were imported; set it before the "
            "process starts"
        )
    return interpreted


@cache
def _kernels_interpreted() -> bool:
    from infernetes.kernels.triton_backend import activation

    return not isinstance(activation.silu_and_mul_kernel, triton.runtime.JITFunction)


def dot_dtype(dtype: torch.dtype):
    """The dtype `tl.dot` operands are cast to (accumulation is always float32).

    fp16/bf16 use the tensor cores on a GPU. The interpreter computes bf16 math wrongly (Triton
    3.x, numpy has no bfloat16), so it gets float32 throughout.
    """
    if dtype == torch.float32 or interpreting():
        return tl.float32
    return TL_DTYPES[dtype]


def dot_precision(dot: Any) -> str:
    """`tl.dot`'s ``input_precision`` for operands of the `dot_dtype` ``dot``: float32 products in
    full precision ("ieee"; Triton's default on a GPU is TF32, whose 10-bit mantissa parts from the
    CPU's float32 tokens), the rest on the tensor cores as they are."""
    return "ieee" if dot == tl.float32 else "tf32"


def next_pow2(n: int, minimum: int = 1) -> int:
    return max(triton.next_power_of_2(n), minimum)


def fp8_rounding_args(dtype: torch.dtype) -> dict:
    """Constexpr kernel arguments that turn on `round_to_fp8_grid` under the interpreter."""
    from infernetes.kernels.triton_backend.fp8_rounding import FP8_FORMATS

    mantissa, min_exp = FP8_FORMATS.get(dtype, (0, 0))
    return dict(
        FP8_PREROUND=interpreting() and dtype in FP8_FORMATS,
        FP8_MANTISSA=mantissa,
        FP8_MIN_EXP=min_exp,
    )


def check_fp8_supported(t: torch.Tensor) -> None:
    if t.is_cuda and torch.cuda.get_device_capability(t.device) < (8, 9):
        raise ValueError(
            f"{t.dtype} with VLLM_ATTENTION_BACKEND=TRITON_ATTN needs an NVIDIA GPU of compute "
            "capability 8.9 or newer (Ada, Hopper); use --kv-cache-dtype auto or TORCH_SDPA"
        )
