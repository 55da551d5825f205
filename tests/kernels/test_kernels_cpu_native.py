"""The CPU path's C decode kernel reads the paged cache in place and gives what the torch
reference gives: every dtype, GQA ratio, block size, fp8 cache, mixed prefill/decode batches and
padding rows; and the CPU path falls back to the reference when the kernel cannot be built."""

from __future__ import annotations

import pytest
import torch
from infernetes.kernels import ops
from infernetes.kernels.cpu import attention as cpu_attention
from infernetes.kernels.cpu import native
from infernetes.kernels.reference import attention as reference
from infernetes.kernels.testing import naive_paged_attention, random_paged_batch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}

CASES = [
    # q_lens, seq_lens, heads, kv heads, head_dim, block_size, dtype, cache dtype
    ([1, 1, 1], [5, 33, 70], 4, 4, 16, 16, torch.float32, None),
    ([1, 1, 1], [1, 16, 17], 8, 2, 64, 16, torch.float32, None),  # block edges, GQA 4
    ([1, 1], [17, 64], 8, 1, 32, 8, torch.float16, None),  # MQA
    ([1, 1], [9, 40], 4, 2, 24, 16, torch.bfloat16, None),  # head_dim not a power of two
    ([1, 1, 1], [3, 130, 31], 4, 4, 64, 32, torch.bfloat16, None),
    ([1, 1], [12, 50], 4, 2, 16, 8, torch.float32, E4M3),
    ([1, 1], [12, 50], 4, 2, 16, 8, torch.bfloat16, E5M2),
    ([4, 1, 7, 1], [4, 20, 30, 9], 4, 2, 16, 8, torch.float32, None),  # mixed prefill + decode
]


@pytest.fixture(autouse=True)
def _needs_the_kernel():
    if native.load("paged_decode") is None:
        pytest.skip("no C compiler: the CPU path runs the torch reference")


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c[1]}-{c[2]}x{c[3]}-d{c[4]}-b{c[5]}-{c[6]}-{c[7]}"
)
def test_native_decode_matches_the_reference(case):
    q_lens, seq_lens, heads, kv_heads, head_dim, block_size, dtype, cache_dtype = case
    batch = random_paged_batch(
        q_lens, seq_lens, heads, kv_heads, head_dim, block_size, dtype, cache_dtype
    )
    out = cpu_attention.paged_attention(*batch.args())
    expected = reference.paged_attention(*batch.args())
    tol = TOL[dtype] * (4 if cache_dtype else 1)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    if dtype == torch.float32:  # and the float64 oracle, token by token
        torch.testing.assert_close(out.double(), naive_paged_attention(batch), atol=1e-5, rtol=1e-5)


def test_native_decode_reads_a_strided_query_and_never_stale_slots():
    batch = random_paged_batch([1, 1, 1], [9, 25, 3], 4, 2, 16, 8)
    fused = torch.randn(
        3, 8, 16
    )  # q sits in the first 4 heads of a wider row, as after a qkv split
    fused[:, :4] = batch.query
    batch.query = fused[:, :4]
    expected = reference.paged_attention(*batch.args())
    for cache in (batch.k_cache, batch.v_cache):  # NaN in every slot past each sequence's end
        for b, n in enumerate(batch.seq_lens.tolist()):
            blocks = batch.block_tables[b].long()
            cache[blocks[n // 8], n % 8 :] = float("nan")
            cache[blocks[n // 8 + 1 :]] = float("nan")
    torch.testing.assert_close(
        cpu_attention.paged_attention(*batch.args()), expected, atol=2e-5, rtol=2e-5
    )


def test_padding_rows_give_zeros():
    batch = random_paged_batch([1, 1, 1], [9, 1, 20], 4, 2, 16, 8)
    batch.seq_lens[1] = 0
    out = cpu_attention.paged_attention(*batch.args())
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out, reference.paged_attention(*batch.args()), atol=2e-5, rtol=2e-5)


def test_ops_dispatch_to_the_cpu_path(monkeypatch):
    batch = random_paged_batch([1, 1], [7, 19], 4, 2, 16, 8)
    calls = []
    real = native.load("paged_decode").paged_decode_attention

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(native.load("paged_decode"), "paged_decode_attention", counting)
    ops.paged_attention(*batch.args())
    assert len(calls) == 1


def test_falls_back_to_the_reference_without_the_kernel(monkeypatch):
    batch = random_paged_batch([1, 3], [7, 19], 4, 2, 16, 8)
    monkeypatch.setattr(native, "load", lambda name: None)
    torch.testing.assert_close(
        cpu_attention.paged_attention(*batch.args()), reference.paged_attention(*batch.args())
    )


def test_kernel_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    compiler = native._compiler()
    first = native._build("paged_decode", compiler)
    assert first.parent == tmp_path and first.suffix == ".so"
    stamp = first.stat().st_mtime_ns
    assert native._build("paged_decode", compiler) == first and first.stat().st_mtime_ns == stamp


def test_kernels_are_cached_under_vllm_cache_root(tmp_path, monkeypatch):
    monkeypatch.delenv(native.CACHE_ENV, raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    built = native._build("paged_decode", native._compiler())
    assert built.parent == tmp_path / "vllm-cache" / "kernels"
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "own"))  # the specific setting wins
    assert native.cache_dir() == tmp_path / "own"


def test_kernel_cache_default_without_vllm_cache_root(tmp_path, monkeypatch):
    for name in (native.CACHE_ENV, "VLLM_CACHE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert native.cache_dir() == tmp_path / "infernetes" / "kernels"


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv(native.ENABLE_ENV, "0")
    native.load.cache_clear()
    try:
        assert native.load("paged_decode") is None
    finally:
        monkeypatch.delenv(native.ENABLE_ENV)
        native.load.cache_clear()


def test_a_compile_error_is_reported_and_falls_back(tmp_path, monkeypatch, caplog):
    (tmp_path / "broken.c").write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCE_DIR", tmp_path)
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    assert native.load.__wrapped__("broken") is None
    assert "broken.c" in caplog.text
