"""The CPU path's few-row linear on dense weights (kernels/cpu/skinny_linear.c) gives the float64
product: float32 and bfloat16, 1 to 8 rows, odd output counts (a last block of fewer rows), input
sizes that are no multiple of a vector, with and without bias, strided rows; each instruction set
the kernel is built for where this CPU runs it. The linear layers use it for decode batches and
leave larger ones to torch."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from infernetes.kernels.cpu import native
from infernetes.kernels.cpu import skinny_linear as cpu

# relative to the largest output: float32 sums in another order; bfloat16 rounds the output once
TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}

# This CPU's own build (AVX-512 with the bf16 dot product here), AVX-512 without it, AVX2, and
# the plain x86-64 vectors.
ISAS = {"native": None, "x86-64-v4": "avx512bw", "x86-64-v3": "avx2", "x86-64": None}


def _cpu_has(flag: str | None) -> bool:
    if flag is None:
        return True
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.fixture(autouse=True, params=list(ISAS))
def _needs_the_kernel(request, monkeypatch):
    isa = request.param
    if isa != "native" and (platform.machine() != "x86_64" or not _cpu_has(ISAS[isa])):
        pytest.skip(f"this CPU cannot run the {isa} build")
    if isa != "native":
        monkeypatch.setenv(native.MARCH_ENV, isa)
    # single float32 rows too, which stay with torch on Intel CPUs (test_a_single_float32_row_...)
    monkeypatch.setattr(native, "mkl_tuned_here", lambda: False)
    native.load.cache_clear()
    if native.load("skinny_linear") is None:
        pytest.skip("no C compiler: the CPU path runs torch")
    yield
    monkeypatch.undo()
    native.load.cache_clear()


def expected(x, weight, bias):
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


def assert_close(out, want, dtype):
    assert out.dtype == dtype
    error = (out.double() - want).abs().max() / want.abs().max()
    assert error < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
# (33, 4500): one row of x streams row by row, more go block by block (x past 32 KB of L1)
@pytest.mark.parametrize("outputs, inputs", [(37, 384), (5, 7), (130, 897), (1, 48), (33, 4500)])
def test_matches_the_float64_product(dtype, rows, outputs, inputs):
    gen = torch.Generator().manual_seed(rows * 1000 + outputs + inputs)
    weight = torch.randn(outputs, inputs, generator=gen).to(dtype)
    x = torch.randn(rows, inputs, generator=gen).to(dtype)
    bias = torch.randn(outputs, generator=gen).to(dtype)
    assert cpu.handles(x, weight)
    for b in (None, bias):
        assert_close(cpu.linear(x, weight, b), expected(x, weight, b), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows_in_a_batch(dtype):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(21, 100, generator=gen).to(dtype)
    wide = torch.randn(2, 3, 108, generator=gen).to(dtype)
    x = wide[..., 4:104]  # rows with a stride of their own, batched as [2, 3, K]
    out = cpu.linear(x, weight, None)
    assert out.shape == (2, 3, 21)
    assert_close(out.reshape(-1, 21), expected(x.reshape(-1, 100), weight, None), dtype)


def test_a_swapped_row_would_fail():
    """The tolerance catches what it is there for: one output row's weights exchanged with its
    neighbour's moves the product far beyond it."""
    gen = torch.Generator().manual_seed(8)
    weight, x = torch.randn(9, 64, generator=gen), torch.randn(1, 64, generator=gen)
    out = cpu.linear(x, weight[[1, 0, *range(2, 9)]], None)
    assert (out.double() - expected(x, weight, None)).abs().max() > 100 * TOL[torch.float32]


def test_what_it_leaves_to_torch():
    weight = torch.randn(8, 16)
    assert not cpu.handles(torch.randn(cpu.MAX_ROWS + 1, 16), weight)  # a prefill batch
    assert not cpu.handles(torch.randn(0, 16), weight)
    assert not cpu.handles(torch.randn(1, 16).half(), weight.half())
    assert not cpu.handles(torch.randn(1, 16).bfloat16(), weight)  # dtypes differ
    assert not cpu.handles(torch.randn(1, 8), weight.t())  # not contiguous


@pytest.mark.parametrize("tuned", [False, True])
def test_a_single_float32_row_stays_with_torch_where_mkl_is_made_for_the_cpu(tuned, monkeypatch):
    monkeypatch.setattr(native, "mkl_tuned_here", lambda: tuned)
    weight = torch.randn(8, 16)
    assert cpu.handles(torch.randn(1, 16), weight) is not tuned
    assert cpu.handles(torch.randn(2, 16), weight)
    assert cpu.handles(torch.randn(1, 16).bfloat16(), weight.bfloat16())


def test_linear_layers_use_it_for_decode_only(monkeypatch):
    from infernetes.runtime.model_executor.layers.linear import ReplicatedLinear

    layer = ReplicatedLinear(48, 20, bias=True)
    gen = torch.Generator().manual_seed(9)
    layer.weight.data.copy_(torch.randn(20, 48, generator=gen))
    layer.bias.data.copy_(torch.randn(20, generator=gen))
    calls = []
    kernel = cpu.linear
    monkeypatch.setattr(cpu, "linear", lambda *a: calls.append(a[0].shape) or kernel(*a))
    for rows in (1, 4, 40):
        x = torch.randn(rows, 48, generator=gen)
        assert_close(layer(x), expected(x, layer.weight, layer.bias), torch.float32)
    assert calls == [(1, 48), (4, 48)]


def test_a_float32_lm_head_uses_it(monkeypatch):
    from infernetes.runtime.model_executor.layers.embedding import ParallelLMHead

    head = ParallelLMHead(50, 48)
    gen = torch.Generator().manual_seed(10)
    head.weight.data.copy_(torch.randn(50, 48, generator=gen))
    head.pack_for_cpu()  # float32: nothing to pack
    calls = []
    kernel = cpu.linear
    monkeypatch.setattr(cpu, "linear", lambda *a: calls.append(a[0].shape) or kernel(*a))
    x = torch.randn(2, 48, generator=gen)
    assert_close(head(x), expected(x, head.weight, None), torch.float32)
    assert calls == [(2, 48)]
