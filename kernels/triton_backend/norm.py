"""RMSNorm with the optional fused residual add; one program per row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infernetes.kernels.triton_backend.common import next_pow2


@triton.jit
def rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    num_rows,
    n,
    eps,
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """BLOCK_R rows per program: narrow rows (per-head q/k norms) would waste a program each."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    offs = tl.arange(0, BLOCK)[None, :]
    mask = (rows < num_rows) & (offs < n)
    x = tl.load(x_ptr + rows * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows * stride_res + offs, mask=mask, other=0.0).to(tl.float32)
        # The sum is rounded to the model dtype (it is the next residual), then normalised.
        x = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + rows * stride_res_out + offs, x, mask=mask)
        x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n + eps)
    normed = (x * rstd[:, None]).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + rows * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    res2 = _rows(residual) if residual is not None else x2
    res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    block = next_pow2(n)
    block_r = max(1, min(16, 2048 // block))
    if x2.shape[0]:
        rms_norm_kernel[(triton.cdiv(x2.shape[0], block_r),)](
            x2,
            res2,
            weight.contiguous(),
            out,
            res_out,
            x2.shape[0],
            n,
            eps,
            x2.stride(0),
            res2.stride(0),
            out.stride(0),
            res_out.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK_R=block_r,
            BLOCK=block,
            num_warps=min(max(block * block_r // 512, 1), 8),  # about 16 elements per thread
        )
    out = out.reshape(x.shape)
    return out if residual is None else (out, res_out.reshape(x.shape))
