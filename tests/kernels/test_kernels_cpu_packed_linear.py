"""CPU linear layers with oneDNN-packed bf16/fp16 weights give what F.linear gives (bit for bit on
AVX-512 CPUs; within bf16 rounding where oneDNN picks another kernel for the packed layout, as on
AMX CPUs), and the engine produces the same tokens with the CPU kernels on and off. Row counts
reach oneDNN padded to a few sizes, so its per-shape primitive caches stay small."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from infernetes.kernels.cpu import native, packed_linear
from infernetes.runtime.model_executor.layers.linear import RowParallelLinear

needs_onednn = pytest.mark.skipif(
    packed_linear.pack_weight(torch.ones(4, 4, dtype=torch.bfloat16)) is None,
    reason="no oneDNN packing here",
)


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_packed_linear_matches_f_linear(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(rows, 40, generator=gen).to(dtype)
    packed = packed_linear.pack_weight(weight)
    if packed is None:  # fp16 packing needs avx512_fp16 or avx_ne_convert
        pytest.skip(f"oneDNN cannot pack {dtype} weights on this CPU")
    for b in (None, bias):
        # one unit in the last place of the 16-bit result: only the summation order may differ
        torch.testing.assert_close(
            packed_linear.linear(x, packed, b), F.linear(x, weight, b), rtol=2**-7, atol=1e-2
        )
    assert packed_linear.linear(x.view(1, rows, 40), packed, None).shape == (1, rows, 96)


def test_padded_rows_are_few_sizes_at_most_an_eighth_larger():
    sizes = {packed_linear.padded_rows(rows) for rows in range(1, 8193)}
    assert len(sizes) == 88  # 15 exact small counts, then 8 per doubling
    for rows in range(1, 8193):
        padded = packed_linear.padded_rows(rows)
        assert rows <= padded <= rows * 1.125
        assert padded == rows or rows >= 16  # decode batches under 16 rows run as they are


@needs_onednn
def test_onednn_sees_only_padded_row_counts_and_the_real_rows_are_unchanged(monkeypatch):
    # Every distinct row count builds a oneDNN primitive that its caches keep (~1 MB each):
    # unpadded, an engine process grew by about 2 GB under a varied load.
    seen = set()
    onednn_linear = torch.ops.mkldnn._linear_pointwise

    def recording(x, *args):
        seen.add(x.shape[0])
        return onednn_linear(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", recording)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=gen).to(torch.bfloat16)
    packed = packed_linear.pack_weight(weight)
    x = torch.randn(600, 32, generator=gen).to(torch.bfloat16)
    for rows in range(1, 601):
        out = packed_linear.linear(x[:rows], packed, None)
        assert out.shape == (rows, 48)
        torch.testing.assert_close(out, F.linear(x[:rows], weight), rtol=2**-7, atol=1e-2)
    assert seen == {packed_linear.padded_rows(rows) for rows in range(1, 601)}
    assert len(seen) < 70


def test_float32_and_fp8_weights_stay_plain(monkeypatch):
    assert packed_linear.pack_weight(torch.randn(8, 8)) is None
    assert packed_linear.pack_weight(torch.randn(8, 8).to(torch.float8_e4m3fn)) is None
    monkeypatch.setenv(native.ENABLE_ENV, "0")
    assert packed_linear.pack_weight(torch.randn(8, 8, dtype=torch.bfloat16)) is None


@needs_onednn
def test_a_packed_layer_drops_its_plain_weight_and_computes_the_same():
    torch.manual_seed(0)
    layer = RowParallelLinear(32, 16, bias=True).to(torch.bfloat16)
    layer.weight.data.normal_()  # built with torch.empty: fill before comparing
    layer.bias.data.normal_()
    x = torch.randn(5, 32, dtype=torch.bfloat16)
    expected = layer(x)
    layer.pack_for_cpu()
    assert layer.packed_weight is not None and layer.weight.numel() == 0
    assert torch.equal(layer(x), expected)


@needs_onednn
def test_engine_tokens_are_the_same_with_cpu_kernels_on_and_off(tmp_path, monkeypatch):
    from infernetes.runtime.testing import make_tiny_model

    from infernetes import LLM, SamplingParams

    path = make_tiny_model(tmp_path, "LlamaForCausalLM", num_key_value_heads=2)
    prompts = [[5, 9, 3, 22, 17, 8], [40, 2, 2, 7], list(range(30, 60))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def generate() -> list[list[int]]:
        llm = LLM(
            str(path),
            dtype="bfloat16",
            skip_tokenizer_init=True,
            num_gpu_blocks_override=64,
            block_size=8,
        )
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]

    with_kernels = generate()
    monkeypatch.setenv(native.ENABLE_ENV, "0")
    native.load.cache_clear()
    try:
        assert generate() == with_kernels
    finally:
        monkeypatch.delenv(native.ENABLE_ENV)
        native.load.cache_clear()


AMD_AVX512 = {"vendor_id": "AuthenticAMD", "flags": "fpu sse2 avx2 avx512f avx512bw"}


@pytest.fixture
def cpu_is(monkeypatch):
    """Sets the CPU `packed_linear` sees (its /proc/cpuinfo fields) for one test."""

    def set_fields(fields: dict[str, str]) -> None:
        monkeypatch.setattr(native, "cpu_fields", lambda: fields)
        forget()

    def forget() -> None:
        native.mkl_tuned_here.cache_clear()
        packed_linear.mkl_float32_is_avx2.cache_clear()

    yield set_fields
    forget()


@needs_onednn
@pytest.mark.parametrize("rows", [packed_linear.FLOAT32_MIN_ROWS, 300])
def test_float32_prefill_rows_go_through_onednn_within_float32_rounding(rows, monkeypatch, cpu_is):
    """A plain float32 layer's prefill rows run oneDNN on the weight reordered for the call
    where torch's float32 GEMM (MKL) runs AVX2 code, an AVX-512 CPU not Intel's: within float32
    summation of the float64 product, the weight still plain; fewer rows stay on F.linear."""
    if not torch.backends.mkl.is_available():
        pytest.skip("torch built without MKL")
    cpu_is(AMD_AVX512)
    calls = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(
        torch.ops.mkldnn, "_reorder_linear_weight", lambda *a: calls.append(1) or reorder(*a)
    )
    torch.manual_seed(rows)
    layer = RowParallelLinear(96, 40, bias=True)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    layer.pack_for_cpu()
    assert layer.packed_weight is None and layer.weight.numel() == 96 * 40  # float32 stays plain
    x = torch.randn(1, rows, 96)
    exact = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    out = layer(x)
    assert calls and out.shape == (1, rows, 40) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=1e-5 * exact.abs().max().item())
    calls.clear()
    assert torch.equal(
        layer(x[:, : packed_linear.FLOAT32_MIN_ROWS - 1]),
        F.linear(x[:, : packed_linear.FLOAT32_MIN_ROWS - 1], layer.weight, layer.bias),
    )
    assert not calls


@pytest.mark.parametrize(
    ("fields", "reorders"),
    [
        (AMD_AVX512, True),
        ({"vendor_id": "GenuineIntel", "flags": AMD_AVX512["flags"] + " amx_bf16"}, False),
        ({"vendor_id": "AuthenticAMD", "flags": "fpu sse2 avx2"}, False),
        ({}, False),
    ],
)
def test_float32_prefill_is_reordered_only_where_mkl_runs_avx2_code(fields, reorders, cpu_is):
    cpu_is(fields)
    assert packed_linear.mkl_float32_is_avx2() == (reorders and torch.backends.mkl.is_available())
