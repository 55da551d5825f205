"""Rounding to the fp8 grid in float32, for Triton's interpreter.

The interpreter's float32 -> fp8 conversion (Triton 3.x `_convert_float`) rounds by adding the
cut-off bit to the mantissa without carrying into the exponent: 124.3 becomes 64 instead of 128
in e4m3. Values already on the fp8 grid convert exactly, so under the interpreter the kernels
round first with this helper (ties to even, like the hardware); compiled kernels convert directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (mantissa bits, smallest normal exponent) of each fp8 format
FP8_FORMATS = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}


@triton.jit
def round_to_fp8_grid(x, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
    a = tl.abs(x)
    e = tl.floor(tl.log2(tl.maximum(a, 1e-30)))
    # log2 may land a hair off at exact powers of two: settle e so that 2^e <= a < 2^(e+1)
    e = tl.where(tl.exp2(e) > a, e - 1, e)
    e = tl.where(tl.exp2(e + 1) <= a, e + 1, e)
    e = tl.maximum(e, MIN_EXP)  # subnormals share the smallest exponent's step
    step = tl.exp2(e - MANTISSA)
    y = a / step
    f = tl.floor(y)
    d = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f) * step
    return tl.where(x < 0, -r, r)
