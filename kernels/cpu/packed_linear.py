"""bf16/fp16 linear layers on the CPU with the weight packed once for oneDNN.

``F.linear`` on a CPU reorders a bf16/fp16 weight into oneDNN's blocked layout (the one AMX and
AVX-512 matmuls read) on every call; for the small batches of decode that reorder costs as much as
the product (measured here: the 32000-row LM head at 64 rows 8.5 ms plain, 4.6 ms packed). Packing
once at load gives bit-identical results on AVX-512 CPUs; on AMX CPUs oneDNN may sum larger batches
in another order (within bf16 rounding). float32 weights stay plain: decode's few rows take
skinny_linear's kernel, and prefill's many rows (``FLOAT32_MIN_ROWS``) on AVX-512 CPUs not made
by Intel oneDNN with the weight reordered for each call: torch's own float32 GEMM (MKL) runs its
AVX2 code there, at half the speed, where on Intel's it beats the reorder. oneDNN sums in another
order than MKL (about 1e-6 apart, relative), so where float32 runs are compared exactly with
transformers, their prompts are shorter than that.

oneDNN builds a primitive for each input shape and keeps it in two caches (oneDNN's own and
ideep's, 1,024 entries each), about 0.7-1 MB of heap per shape. The row count is the number of
tokens in an engine step, which takes hundreds of values under a varied load: measured on a tiny
model, the engine process grew by ~2 GB before those caches filled. So the rows are padded up to
one of a few sizes (``padded_rows``): at most 8 per doubling, a bounded set of primitives built
once, at most 12.5% more rows. Rows are computed independently, so the padding changes nothing
in the real rows' results.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from infernetes.kernels.cpu import native

logger = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.bfloat16, torch.float16)
_BATCH_HINT = 64  # the row count oneDNN picks its blocking for; decode batches are about this size
# float32 products of this many rows or more (prefill) go through oneDNN, the weight reordered per
# call, where torch's float32 GEMM (MKL) runs its AVX2 code: AVX-512 CPUs not made by Intel.
# Measured (2 threads, Qwen2.5-0.5B's MLP), MKL against oneDNN with the reorder: on an AMD EPYC
# 197 against 413 GFLOP/s at 512 rows, 174 against 217 at 64, and 121 against 82 at 16, where the
# reorder costs more than it saves; on an Intel Xeon (AMX) MKL was ahead at every size, 1.03-1.4x
# from 128 rows up (`mkl_float32_is_avx2`).
FLOAT32_MIN_ROWS = 128


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` `[N, K]` packed for `linear`, or None when it stays a plain tensor (not a CPU
    bf16/fp16 weight, oneDNN unavailable, or the CPU kernels turned off)."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE_DTYPES or weight.dim() != 2:
        return None
    if not native.enabled() or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _BATCH_HINT)
    except (RuntimeError, AttributeError) as error:  # a torch build or CPU without these oneDNN ops
        _warn_unpacked(weight.dtype, str(error))
        return None


@functools.cache
def _warn_unpacked(dtype: torch.dtype, reason: str) -> None:
    # once per dtype, not once per layer
    logger.warning(
        "oneDNN cannot pack %s weights here (%s): CPU linear layers run unpacked", dtype, reason
    )


def padded_rows(rows: int) -> int:
    """The row count a product of `rows` rows runs at: `rows` itself below 16 (small decode
    batches, where extra rows would cost time), else rounded up to a multiple of 1/8 of the
    power of two below it (8 sizes per doubling)."""
    step = 1 << max(rows.bit_length() - 4, 0)
    return -(-rows // step) * step


@functools.cache
def mkl_float32_is_avx2() -> bool:
    """Whether torch's float32 GEMM (MKL) runs narrower vectors than this CPU has (asked once:
    every float32 prefill product asks)."""
    return (
        torch.backends.mkl.is_available()
        and not native.mkl_tuned_here()
        and "avx512f" in native.cpu_fields().get("flags", "").split()
    )


def reorders_float32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear_float32` computes ``F.linear(x, weight)``: a plain float32 CPU weight and
    x of at least ``FLOAT32_MIN_ROWS`` rows (prefill), on a CPU where MKL runs AVX2 code only,
    oneDNN available, the CPU kernels on."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == x.dtype == torch.float32
        and weight.dim() == 2
        and x.numel() // max(x.shape[-1], 1) >= FLOAT32_MIN_ROWS
        and not torch.compiler.is_compiling()
        and native.enabled()
        and torch.backends.mkldnn.is_available()
        and mkl_float32_is_avx2()
    )


def linear_float32(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN, the plain float32 weight reordered for this
    call (no second copy held), for inputs `reorders_float32` accepts."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, padded_rows(x.numel() // x.shape[-1]))
    return linear(x, packed, bias)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with the weight from `pack_weight`; `x` is `[..., K]`."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    # Under torch.compile the row count is symbolic; the compiled graph handles its shapes.
    padded = rows if torch.compiler.is_compiling() else padded_rows(rows)
    if padded != rows:
        flat = F.pad(flat, (0, 0, 0, padded - rows))
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out[:rows].view(*x.shape[:-1], out.shape[-1])
