"""The CPU path's C kernels for RMSNorm, rotary embedding and SiLU-and-mul give the torch
reference's results: bit for bit where the reference's rounding is reproducible (rotary, SiLU in
bf16/fp16), within float32 rounding of the sum of squares for RMSNorm."""

from __future__ import annotations

import pytest
import torch
from infernetes.kernels import ops
from infernetes.kernels.cpu import elementwise, native
from infernetes.kernels.reference import activation, norm, rotary
from infernetes.kernels.rope import build_cos_sin_cache

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _needs_the_kernels():
    if native.load("elementwise") is None:
        pytest.skip("no C compiler: the CPU path runs the torch reference")


def _close(actual, expected, dtype):
    # one unit in the last place of the storage type, from a sum of squares added in another order
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 96), (64, 512)])
def test_rms_norm_matches_the_reference(dtype, rows, hidden):
    gen = torch.Generator().manual_seed(rows)
    wide = torch.randn(rows, hidden * 2, generator=gen).to(dtype)
    x = wide[:, :hidden]  # rows with a stride of their own, as a slice of a wider output
    residual = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (1 + torch.randn(hidden, generator=gen) * 0.1).to(dtype)
    _close(elementwise.rms_norm(x, weight, 1e-6), norm.rms_norm(x, weight, 1e-6), dtype)
    out, summed = elementwise.rms_norm(x, weight, 1e-6, residual)
    expected_out, expected_sum = norm.rms_norm(x, weight, 1e-6, residual)
    assert torch.equal(summed, expected_sum)  # the residual sum rounds exactly as torch's add
    _close(out, expected_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])  # whole head, and partial rotary
def test_rotary_matches_the_reference_bitwise(dtype, is_neox, rotary_dim):
    gen = torch.Generator().manual_seed(rotary_dim)
    cache = build_cos_sin_cache(rotary_dim, 256, 10000.0)
    positions = torch.randint(0, 256, (9,), generator=gen)
    qkv = torch.randn(9, (4 + 2 * 2) * 32, generator=gen).to(dtype)
    query = qkv[:, : 4 * 32].view(9, 4, 32)  # strided views of the fused projection
    key = qkv[:, 4 * 32 : 6 * 32].view(9, 2, 32)
    before = qkv.clone()
    q, k = elementwise.rotary_embedding(positions, query, key, cache, is_neox)
    rq, rk = rotary.rotary_embedding(positions, query, key, cache, is_neox)
    assert torch.equal(q, rq) and torch.equal(k, rk)
    assert torch.equal(qkv, before)  # inputs untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_the_reference(dtype):
    x = (torch.randn(33, 2 * 80, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    out = elementwise.silu_and_mul(x)
    expected = activation.silu_and_mul(x)
    if dtype == torch.float32:  # expf and torch's vectorised exp may differ in the last bit
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    else:
        torch.testing.assert_close(
            out.float(), expected.float(), atol=0, rtol=torch.finfo(dtype).eps
        )


def test_ops_use_the_c_kernels_on_a_cpu_and_fall_back_without_them(monkeypatch):
    x = torch.randn(4, 64)
    weight = torch.ones(64)
    calls = []
    library = native.load("elementwise")
    real = library.rms_norm
    monkeypatch.setattr(library, "rms_norm", lambda *a: calls.append(a) or real(*a))
    ops.rms_norm(x, weight, 1e-6)
    assert len(calls) == 1
    monkeypatch.setattr(native, "load", lambda name: None)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6), norm.rms_norm(x, weight, 1e-6))
    torch.testing.assert_close(ops.silu_and_mul(x), activation.silu_and_mul(x))


def test_unsupported_shapes_take_the_reference():
    x = torch.randn(2, 3, 64)  # 3-D: the reference handles it
    weight = torch.ones(64)
    torch.testing.assert_close(
        elementwise.rms_norm(x, weight, 1e-6), norm.rms_norm(x, weight, 1e-6)
    )
    torch.testing.assert_close(elementwise.silu_and_mul(x), activation.silu_and_mul(x))
