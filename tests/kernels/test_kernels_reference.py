"""The torch reference ops against plain oracles and transformers' own layers."""

import pytest
import torch
from infernetes.kernels.reference import activation, attention, cache, fp8, norm, rotary
from infernetes.kernels.rope import build_cos_sin_cache
from infernetes.kernels.testing import naive_paged_attention, random_paged_batch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_paged_attention_matches_oracle(block_size, num_heads, num_kv_heads, dtype):
    # decode, full prefill, chunked prefill over a cached prefix, decode at a block boundary
    batch = random_paged_batch(
        q_lens=[1, 7, 5, 1],
        seq_lens=[9, 7, 19, 16],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=16,
        block_size=block_size,
        dtype=dtype,
        seed=block_size,
    )
    out = attention.paged_attention(*batch.args())
    assert out.dtype == dtype and out.shape == batch.query.shape
    torch.testing.assert_close(
        out.double(), naive_paged_attention(batch), atol=TOL[dtype] * 5, rtol=0
    )


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_reference_paged_attention_fp8_cache(cache_dtype):
    batch = random_paged_batch([1, 6], [13, 6], 4, 2, 8, 4, torch.float32, cache_dtype=cache_dtype)
    torch.testing.assert_close(
        attention.paged_attention(*batch.args()).double(),
        naive_paged_attention(batch),
        atol=1e-5,
        rtol=0,
    )


def test_store_kv_writes_slots_and_skips_padding():
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    cache.store_kv(key, value, k_cache, v_cache, torch.tensor([9, -1, 2]))
    assert torch.equal(k_cache[2, 1], key[0]) and torch.equal(v_cache[0, 2], value[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2  # the -1 row wrote nothing


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_kv_fp8_quantises_with_scale(cache_dtype):
    k_cache = torch.zeros(2, 4, 1, 8, dtype=cache_dtype)
    v_cache = torch.zeros(2, 4, 1, 8, dtype=cache_dtype)
    key, value = torch.randn(2, 1, 8) * 30, torch.randn(2, 1, 8)
    k_scale, v_scale = torch.tensor(0.25), torch.tensor(0.01)
    cache.store_kv(key, value, k_cache, v_cache, torch.tensor([0, 5]), k_scale, v_scale)
    rel = 0.07 if cache_dtype == torch.float8_e4m3fn else 0.13
    torch.testing.assert_close(
        k_cache[1, 1].float() * k_scale, key[1], rtol=rel, atol=k_scale.item()
    )
    torch.testing.assert_close(
        v_cache[0, 0].float() * v_scale, value[0], rtol=rel, atol=v_scale.item()
    )
    with pytest.raises(ValueError, match="k_scale"):
        cache.store_kv(key, value, k_cache, v_cache, torch.tensor([0, 5]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(dtype):
    layer = LlamaRMSNorm(64, eps=1e-5)
    layer.weight.data = torch.randn(64)
    layer = layer.to(dtype)
    x, res = torch.randn(5, 64).to(dtype), torch.randn(5, 64).to(dtype)
    assert torch.equal(norm.rms_norm(x, layer.weight, 1e-5), layer(x))
    out, summed = norm.rms_norm(x, layer.weight, 1e-5, residual=res)
    assert torch.equal(summed, x + res) and torch.equal(out, layer(x + res))


def test_silu_and_mul():
    x = torch.randn(3, 2, 10)
    torch.testing.assert_close(
        activation.silu_and_mul(x), torch.nn.functional.silu(x[..., :5]) * x[..., 5:]
    )


def _llama_rope(rope_parameters, max_position_embeddings=64, head_dim=16):
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_theta": 10000.0, **rope_parameters},
    )
    return LlamaRotaryEmbedding(config)


ROPE_CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_cos_sin_cache_matches_transformers(case):
    params = ROPE_CASES[case]
    rope = _llama_rope(params)
    cache_ = build_cos_sin_cache(16, 64, 10000.0, params, max_position_embeddings=64)
    positions = torch.arange(64)[None]
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(cache_[:, :8], cos[0, :, :8], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache_[:, 8:], sin[0, :, :8], atol=1e-6, rtol=0)


def test_dynamic_ntk_beyond_the_trained_length_matches_transformers_decode():
    params = ROPE_CASES["dynamic"]
    cache_ = build_cos_sin_cache(16, 100, 10000.0, params, max_position_embeddings=64)
    for pos in (64, 80, 99):
        # transformers decoding the token at `pos` uses a sequence length of pos + 1
        rope = _llama_rope(params)
        rope(torch.zeros(1), torch.arange(pos + 1)[None])
        cos, sin = rope(torch.zeros(1), torch.tensor([[pos]]))
        torch.testing.assert_close(cache_[pos, :8], cos[0, 0, :8], atol=1e-5, rtol=0)
        torch.testing.assert_close(cache_[pos, 8:], sin[0, 0, :8], atol=1e-5, rtol=0)


def test_rope_rejects_unknown_type():
    with pytest.raises(ValueError, match="allowed values"):
        build_cos_sin_cache(16, 8, 10000.0, {"rope_type": "mrope"})
    with pytest.raises(ValueError, match="short_factor, long_factor"):
        build_cos_sin_cache(16, 8, 10000.0, {"rope_type": "longrope"})
    with pytest.raises(ValueError, match="factor"):
        build_cos_sin_cache(16, 8, 10000.0, {"rope_type": "linear"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_neox_matches_transformers(dtype):
    rope = _llama_rope({"rope_type": "default"})
    positions = torch.tensor([3, 0, 17, 63])
    q, k = torch.randn(4, 4, 16).to(dtype), torch.randn(4, 2, 16).to(dtype)
    cos, sin = rope(q, positions[None])
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    cache_ = build_cos_sin_cache(16, 64, 10000.0)
    q_out, k_out = rotary.rotary_embedding(positions, q, k, cache_, is_neox=True)
    assert torch.equal(q_out, q_hf[0].transpose(0, 1)) and torch.equal(
        k_out, k_hf[0].transpose(0, 1)
    )


def test_rotary_gptj_rotates_pairs_and_partial_dims():
    cache_ = build_cos_sin_cache(8, 32, 10000.0)  # rotary_dim 8 of head_dim 12
    positions = torch.tensor([5, 31])
    q, k = torch.randn(2, 3, 12), torch.randn(2, 1, 12)
    q_out, _ = rotary.rotary_embedding(positions, q, k, cache_, is_neox=False)
    angles = positions[:, None].float() * (1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
    pairs = (
        torch.complex(q[..., 0:8:2], q[..., 1:8:2])
        * torch.polar(torch.ones_like(angles), angles)[:, None]
    )
    expected = torch.stack((pairs.real, pairs.imag), dim=-1).flatten(-2)
    torch.testing.assert_close(q_out[..., :8], expected, atol=1e-5, rtol=0)
    assert torch.equal(q_out[..., 8:], q[..., 8:])


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_scaled_fp8_quant_dynamic_and_static(dtype):
    x = torch.randn(16, 32) * 5
    q, scale = fp8.scaled_fp8_quant(x, dtype=dtype)
    assert q.dtype == dtype and scale.dtype == torch.float32
    assert q.float().abs().max().item() == torch.finfo(dtype).max  # amax maps onto the range end
    rel = 0.07 if dtype == torch.float8_e4m3fn else 0.13
    torch.testing.assert_close(q.float() * scale, x, rtol=rel, atol=scale.item() * 2)
    # a static scale too small for x saturates instead of overflowing to inf/nan
    q2, s2 = fp8.scaled_fp8_quant(x, torch.tensor(1e-5), dtype)
    assert s2.item() == pytest.approx(1e-5, rel=1e-6)
    assert q2.float().abs().max().item() == torch.finfo(dtype).max
    with pytest.raises(ValueError, match="fp8 dtype"):
        fp8.scaled_fp8_quant(x, dtype=torch.float16)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_linear_matches_dequantised_weight(per_channel):
    w = torch.randn(24, 32) * torch.linspace(0.1, 4, 24)[:, None]
    qw, scale = fp8.quantize_weight_fp8(w, per_channel=per_channel)
    assert scale.shape == ((24,) if per_channel else ())
    x, bias = torch.randn(5, 32), torch.randn(24)
    out = fp8.fp8_linear(x, qw, scale, bias)
    exact = x @ w.T + bias
    assert ((out - exact).norm() / exact.norm()).item() < 0.05
    torch.testing.assert_close(out, x @ fp8.dequantize_weight(qw, scale, torch.float32).T + bias)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_reference_paged_attention_ignores_nan_garbage_past_the_end(cache_dtype):
    """Unwritten cache slots may hold NaN bit patterns; they must not reach the output."""
    batch = random_paged_batch(
        [1, 1, 3], [5, 13, 6], 4, 2, 8, 8, torch.float32, cache_dtype=cache_dtype
    )
    expected = naive_paged_attention(batch)
    nan = 0x7F if cache_dtype != torch.float32 else float("nan")  # 0x7F is NaN in e4m3fn
    for kv_cache in (batch.k_cache, batch.v_cache):
        raw = kv_cache.view(torch.uint8) if cache_dtype != torch.float32 else kv_cache
        for b, n in enumerate(batch.seq_lens.tolist()):
            blocks = batch.block_tables[b].long()
            raw[blocks[n // 8], n % 8 :] = nan  # the tail of the last block
            raw[blocks[n // 8 + 1 :]] = nan  # table entries past the end (spare blocks)
    out = attention.paged_attention(*batch.args())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


# decodes longer and shorter than the window, a prefill longer than it, a chunk over a prefix
WINDOW_BATCH = dict(q_lens=[1, 1, 12, 5], seq_lens=[30, 4, 12, 21], head_dim=16, block_size=4)


SINKS = torch.tensor([0.5, -1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("window", "softcap", "sinks"),
    [
        (6, None, None),
        (None, 5.0, None),
        (6, 5.0, None),
        (40, None, None),
        (None, None, SINKS),
        (6, 5.0, SINKS),
    ],
)
@pytest.mark.parametrize("path", ["reference", "cpu"])
def test_sliding_window_softcap_and_sinks_match_the_oracle(window, softcap, sinks, path):
    from infernetes.kernels.cpu import attention as cpu_attention

    batch = random_paged_batch(num_heads=4, num_kv_heads=2, **WINDOW_BATCH)
    batch.query.mul_(4)  # scores large enough for the cap to matter
    impl = attention if path == "reference" else cpu_attention
    out = impl.paged_attention(*batch.args(), sliding_window=window, softcap=softcap, sinks=sinks)
    expected = naive_paged_attention(batch, window, softcap, sinks)
    torch.testing.assert_close(out.double(), expected, atol=5e-5, rtol=0)
    if window == 6:  # the window changes the result (the test can fail)
        assert not torch.allclose(out.double(), naive_paged_attention(batch, None, softcap, sinks))
    if sinks is not None:
        assert not torch.allclose(out.double(), naive_paged_attention(batch, window, softcap))


@pytest.mark.parametrize("window", [None, 3])
def test_attention_within_whole_images_matches_the_oracle(window):
    # Gemma 3: sequence 2 (12 new tokens) holds an image at positions 2-7 and sequence 3 (5 new
    # of 21) one at 17-20, cut by its cached prefix: their rows see the whole image.
    from infernetes.kernels import ops

    batch = random_paged_batch(num_heads=4, num_kv_heads=2, **WINDOW_BATCH)
    images = [[], [], [(2, 8)], [(17, 21)]]
    out = attention.paged_attention(*batch.args(), sliding_window=window)
    # (seq, first_row, end_row, first_position, image_end); sequence 2's rows start at 2
    spans = [(2, 2 + 2, 2 + 8, 2, 8), (3, 14 + 1, 14 + 5, 17, 21)]
    ops.attend_within_images(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        spans,
        batch.scale,
        out,
        sliding_window=window,
    )
    expected = naive_paged_attention(batch, window, images=images)
    torch.testing.assert_close(out.double(), expected, atol=5e-5, rtol=0)
    assert not torch.allclose(out.double(), naive_paged_attention(batch, window))
