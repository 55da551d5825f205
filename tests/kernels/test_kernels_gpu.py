"""The kernels compiled on an NVIDIA GPU at real model shapes, and inside CUDA graphs.

Skipped without a GPU (CI); run on a GPU machine with `pytest tests/kernels -m gpu`.
"""

import pytest
import torch
from infernetes.kernels.reference import attention as ref_attention
from infernetes.kernels.reference import fp8 as ref_fp8
from infernetes.kernels.testing import random_paged_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

LLAMA_8B = dict(num_heads=32, num_kv_heads=8, head_dim=128)


def _fp8_capable() -> bool:
    return torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
def test_gpu_decode_attention_llama_shapes(cache_dtype):
    if cache_dtype is not None and not _fp8_capable():
        pytest.skip("fp8 needs compute capability 8.9+")
    from infernetes.kernels import triton_backend as tk

    seq_lens = [1, 15, 16, 17, 300, 2048, 4000, 777]
    batch = random_paged_batch(
        [1] * len(seq_lens),
        seq_lens,
        **LLAMA_8B,
        block_size=16,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        device="cuda",
    )
    out = tk.paged_attention(*batch.args())
    torch.testing.assert_close(
        out, ref_attention.paged_attention(*batch.args()), atol=2e-2, rtol=2e-2
    )


def test_gpu_prefill_attention_with_cached_prefix():
    from infernetes.kernels import triton_backend as tk

    batch = random_paged_batch(
        [1000, 1, 37, 512],
        [1000, 90, 1037, 2000],
        **LLAMA_8B,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
    )
    out = tk.paged_attention(*batch.args())
    torch.testing.assert_close(
        out, ref_attention.paged_attention(*batch.args()), atol=2e-2, rtol=2e-2
    )


def test_gpu_decode_step_replays_in_a_cuda_graph():
    """store_kv + paged_attention captured once, replayed with new block tables and lengths."""
    from infernetes.kernels import triton_backend as tk

    batch = random_paged_batch(
        [1] * 4, [40, 200, 7, 129], **LLAMA_8B, block_size=16, dtype=torch.bfloat16, device="cuda"
    )
    key = torch.randn(4, 8, 128, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    slots = torch.zeros(4, dtype=torch.int64, device="cuda")

    def step():
        tk.store_kv(key, value, batch.k_cache, batch.v_cache, slots)
        return tk.paged_attention(*batch.args())

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    # New values in the same buffers: other lengths, other slots.
    batch.seq_lens.copy_(torch.tensor([41, 201, 8, 130], device="cuda"))
    tables, lens = batch.block_tables, batch.seq_lens
    slots.copy_(
        tables.long().gather(1, ((lens - 1) // 16).long()[:, None])[:, 0] * 16 + (lens - 1) % 16
    )
    key.normal_()
    value.normal_()
    graph.replay()
    torch.cuda.synchronize()
    eager = ref_attention.paged_attention(*batch.args())
    torch.testing.assert_close(static_out, eager, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("per_channel", [False, True])
def test_gpu_fp8_linear_uses_scaled_mm_shapes(per_channel):
    if not _fp8_capable():
        pytest.skip("fp8 needs compute capability 8.9+")
    from infernetes.kernels import triton_backend as tk

    weight = torch.randn(4096, 4096, device="cuda") * 0.02
    qweight, scale = ref_fp8.quantize_weight_fp8(weight, per_channel=per_channel)
    x = torch.randn(33, 4096, device="cuda", dtype=torch.bfloat16)
    got = tk.fp8_linear(x, qweight, scale)
    want = x.float() @ weight.T
    assert ((got.float() - want).norm() / want.norm()).item() < 0.05
