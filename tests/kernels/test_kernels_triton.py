"""Each Triton kernel against its torch reference on random inputs.

On a CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1), on a GPU
compiled; the same tests cover both. Shapes stay small: the interpreter is slow.
"""

import pytest
import torch

pytest.importorskip("triton")  # no Triton wheels outside Linux

from infernetes.kernels import triton_backend as tk
from infernetes.kernels.reference import activation, attention, cache, fp8, norm, rotary
from infernetes.kernels.rope import build_cos_sin_cache
from infernetes.kernels.testing import random_paged_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter rounds float32 -> bf16 by truncation, so bf16 results may differ by one bf16 ulp.
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

ATTENTION_CASES = [
    # q_lens, seq_lens, heads, kv heads, head_dim, block_size, dtype, cache dtype, decode splits
    ([1, 1, 1], [5, 33, 70], 4, 4, 16, 16, torch.float32, None, None),
    ([1, 1, 1], [5, 33, 70], 4, 2, 16, 4, torch.float32, None, 3),  # split-K merge, empty splits
    ([1, 1], [17, 64], 8, 1, 32, 8, torch.float16, None, 2),  # MQA
    ([1, 1], [9, 40], 4, 2, 24, 16, torch.bfloat16, None, 2),  # head_dim not a power of two
    ([1, 1, 1], [3, 20, 41], 4, 2, 16, 4, torch.float32, E4M3, 2),
    ([1, 1], [12, 30], 4, 1, 16, 16, torch.float16, E5M2, None),
    ([6], [6], 4, 4, 16, 4, torch.float32, None, None),  # plain prefill
    (
        [1, 7, 5, 1],
        [9, 7, 19, 16],
        4,
        2,
        16,
        4,
        torch.float32,
        None,
        None,
    ),  # mixed + chunked prefill
    ([20, 3], [45, 3], 8, 2, 16, 1, torch.float16, None, None),  # prefix hit, block_size 1
    ([17, 1], [17, 30], 4, 4, 32, 16, torch.bfloat16, None, None),
    ([5, 2], [21, 9], 4, 2, 16, 8, torch.float32, E4M3, None),
    ([4, 1], [10, 6], 8, 2, 16, 4, torch.bfloat16, E5M2, None),
]


@pytest.mark.parametrize(
    (
        "q_lens",
        "seq_lens",
        "heads",
        "kv_heads",
        "head_dim",
        "block_size",
        "dtype",
        "cache_dtype",
        "splits",
    ),
    ATTENTION_CASES,
)
def test_triton_paged_attention_matches_reference(
    q_lens, seq_lens, heads, kv_heads, head_dim, block_size, dtype, cache_dtype, splits
):
    batch = random_paged_batch(
        q_lens, seq_lens, heads, kv_heads, head_dim, block_size, dtype, cache_dtype, device=DEVICE
    )
    out = tk.paged_attention(*batch.args(), num_splits=splits)
    expected = attention.paged_attention(*batch.args())
    tol = TOL[dtype] * (4 if cache_dtype else 1)
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(
    ("q_lens", "seq_lens", "window", "softcap", "sinks", "dtype", "splits"),
    [
        ([1, 1, 12, 5], [30, 4, 12, 21], 6, None, False, torch.float32, None),  # mixed batch
        ([1, 1, 1], [300, 40, 9], 70, None, False, torch.float32, 3),  # split decode in a window
        ([1, 1, 12, 5], [30, 4, 12, 21], None, 5.0, False, torch.float32, None),
        ([1, 1], [300, 17], None, 5.0, False, torch.float16, 2),
        ([40, 1], [90, 33], 16, 8.0, False, torch.bfloat16, None),  # a long chunk, both at once
        ([1, 1, 12, 5], [30, 4, 12, 21], None, None, True, torch.float32, None),  # sinks: prefill
        ([1, 1, 1], [300, 40, 9], 70, None, True, torch.float32, 3),  # and the split merge
        ([1, 1], [60, 17], None, None, True, torch.bfloat16, None),  # and one split
    ],
)
def test_triton_sliding_window_softcap_and_sinks_match_reference(
    q_lens, seq_lens, window, softcap, sinks, dtype, splits
):
    batch = random_paged_batch(q_lens, seq_lens, 4, 2, 16, 8, dtype, device=DEVICE)
    batch.query.mul_(4)  # scores large enough for the cap to matter
    features = dict(
        sliding_window=window,
        softcap=softcap,
        sinks=torch.tensor([0.5, -1.0, 2.0, 3.0], device=DEVICE) if sinks else None,
    )
    out = tk.paged_attention(*batch.args(), **features, num_splits=splits)
    expected = attention.paged_attention(*batch.args(), **features)
    torch.testing.assert_close(out.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, E4M3, E5M2])
def test_triton_store_kv_matches_reference(cache_dtype):
    gen = torch.Generator().manual_seed(1)
    key = (torch.randn(6, 2, 24, generator=gen) * 3).to(DEVICE)
    value = torch.randn(6, 2, 24, generator=gen).to(DEVICE)
    slots = torch.tensor([0, 7, -1, 13, 2, 31], device=DEVICE)
    k_cache = torch.zeros(4, 8, 2, 24, device=DEVICE).to(cache_dtype)
    caches = [k_cache, k_cache.clone(), k_cache.clone(), k_cache.clone()]
    scales = (torch.tensor(0.02, device=DEVICE), torch.tensor(0.005, device=DEVICE))
    scales = scales if cache_dtype in (E4M3, E5M2) else (None, None)
    tk.store_kv(key, value, caches[0], caches[1], slots, *scales)
    cache.store_kv(key, value, caches[2], caches[3], slots, *scales)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        if cache_dtype == torch.bfloat16:
            torch.testing.assert_close(got.float(), want.float(), atol=0, rtol=TOL[cache_dtype])
        else:  # float32 copies and fp8 rounding (to nearest even) are exact
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "hidden"), [(5, 64), (5, 72), (37, 16)]
)  # 37 x 16: per-head q/k norm
def test_triton_rms_norm_matches_reference(dtype, rows, hidden):
    x = torch.randn(rows, hidden, device=DEVICE).to(dtype)
    residual = torch.randn(rows, hidden, device=DEVICE).to(dtype)
    weight = torch.randn(hidden, device=DEVICE).to(dtype)
    tol = TOL[dtype]
    torch.testing.assert_close(
        tk.rms_norm(x, weight, 1e-6), norm.rms_norm(x, weight, 1e-6), atol=tol, rtol=tol
    )
    out, summed = tk.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_summed = norm.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(summed, ref_summed, atol=tol, rtol=tol)
    torch.testing.assert_close(out, ref_out, atol=tol * 4, rtol=tol * 4)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    ("dtype", "rotary_dim", "head_dim"),
    [(torch.float32, 16, 16), (torch.bfloat16, 8, 12), (torch.float16, 32, 32)],
)
def test_triton_rotary_matches_reference(is_neox, dtype, rotary_dim, head_dim):
    cos_sin = build_cos_sin_cache(
        rotary_dim, 128, 10000.0, {"rope_type": "linear", "factor": 2.0}, device=DEVICE
    )
    positions = torch.tensor([0, 7, 127, 64, 3], device=DEVICE)
    q = torch.randn(5, 4, head_dim, device=DEVICE).to(dtype)
    k = torch.randn(5, 2, head_dim, device=DEVICE).to(dtype)
    got = tk.rotary_embedding(positions, q, k, cos_sin, is_neox)
    want = rotary.rotary_embedding(positions, q, k, cos_sin, is_neox)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=TOL[dtype] * 2, rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_silu_and_mul_matches_reference(dtype):
    x = (torch.randn(3, 2, 80, device=DEVICE) * 3).to(dtype)
    torch.testing.assert_close(
        tk.silu_and_mul(x), activation.silu_and_mul(x), atol=TOL[dtype], rtol=TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_triton_scaled_fp8_quant_matches_reference(dtype):
    x = torch.randn(7, 33, device=DEVICE) * 4
    for scale in (None, torch.tensor(0.003, device=DEVICE)):
        q, s = tk.scaled_fp8_quant(x, scale, dtype)
        q_ref, s_ref = fp8.scaled_fp8_quant(x, scale, dtype)
        torch.testing.assert_close(s, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_fp8_linear_matches_reference(per_channel, dtype):
    weight = torch.randn(48, 64, device=DEVICE)
    qweight, scale = fp8.quantize_weight_fp8(weight, per_channel=per_channel)
    x = torch.randn(2, 5, 64, device=DEVICE).to(dtype)
    bias = torch.randn(48, device=DEVICE).to(dtype)
    got = tk.fp8_linear(x, qweight, scale, bias)
    want = fp8.fp8_linear(x, qweight, scale, bias)
    assert got.shape == (2, 5, 48) and got.dtype == dtype
    # On fp8 GPUs the activations are quantised too (torch._scaled_mm): compare by relative error.
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 0.05
    if DEVICE == "cpu":
        torch.testing.assert_close(got, want, atol=TOL[dtype] * 10, rtol=TOL[dtype])


@pytest.mark.parametrize("q_lens", [[1, 1, 1], [1, 4, 3]])
def test_triton_paged_attention_ignores_nan_garbage_past_the_end(q_lens):
    batch = random_paged_batch(q_lens, [5, 13, 6], 4, 2, 8, 8, torch.float32, E4M3, device=DEVICE)
    expected = attention.paged_attention(*batch.args())
    for kv_cache in (batch.k_cache, batch.v_cache):
        raw = kv_cache.view(torch.uint8)
        for b, n in enumerate(batch.seq_lens.tolist()):
            blocks = batch.block_tables[b].long()
            raw[blocks[n // 8], n % 8 :] = 0x7F  # NaN in e4m3fn
            raw[blocks[n // 8 + 1 :]] = 0x7F
    torch.testing.assert_close(
        tk.paged_attention(*batch.args(), num_splits=2), expected, atol=1e-4, rtol=1e-4
    )


def test_triton_decode_padding_rows_give_zeros():
    """A padded decode batch (CUDA graphs) has rows with seq_len 0; they must not produce NaN."""
    batch = random_paged_batch([1, 1, 1], [9, 1, 20], 4, 2, 16, 8, torch.float32, device=DEVICE)
    batch.seq_lens[1] = 0
    out = tk.paged_attention(*batch.args(), num_splits=2)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(attention.paged_attention(*batch.args())[1], out[1])
    expected = attention.paged_attention(
        batch.query[[0, 2]],
        batch.k_cache,
        batch.v_cache,
        batch.block_tables[[0, 2]],
        batch.cu_seqlens_q[:3],
        batch.seq_lens[[0, 2]],
        batch.scale,
    )
    torch.testing.assert_close(out[[0, 2]], expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_triton_per_token_quant_rows_have_their_own_scale(dtype):
    from infernetes.kernels.triton_backend.fp8 import quant_per_token

    x = (
        torch.randn(4, 2500, device=DEVICE)
        * torch.tensor([0.01, 1.0, 30.0, 500.0], device=DEVICE)[:, None]
    )
    q, scales = quant_per_token(x, dtype)  # 2500 columns: two passes of 2048
    assert scales.shape == (4, 1)
    for row in range(4):
        q_ref, s_ref = fp8.scaled_fp8_quant(x[row], dtype=dtype)
        torch.testing.assert_close(scales[row, 0], s_ref)
        assert torch.equal(q[row].view(torch.uint8), q_ref.view(torch.uint8))


def test_triton_decode_is_independent_of_the_block_table_width():
    """A CUDA graph replays decode over a static block table as wide as --max-seq-len-to-capture
    (its split count follows that width); the extra columns hold stale block ids."""
    from infernetes.kernels.triton_backend.attention import num_decode_splits

    batch = random_paged_batch([1, 1], [37, 1], 4, 1, 16, 16, torch.float32, device=DEVICE)
    batch.seq_lens[1] = 0  # a padding row
    narrow = tk.paged_attention(*batch.args())
    stale = batch.block_tables[:, :1].expand(-1, 40 - batch.block_tables.shape[1])
    batch.block_tables = torch.cat([batch.block_tables, stale], dim=1).contiguous()
    assert num_decode_splits(2, 1, 16 * 3, batch.query.device) == 1  # the narrow table: one split
    assert num_decode_splits(2, 1, 16 * 40, batch.query.device) > 1  # the wide one: split-K + merge
    wide = tk.paged_attention(*batch.args())
    torch.testing.assert_close(wide, narrow, atol=2e-5, rtol=2e-5)
    assert torch.equal(wide[1], torch.zeros_like(wide[1]))
