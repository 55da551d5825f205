"""kernels/cpu/replay.py: recorded C kernel calls and torch ops replay what the forward computes on
the tensors' new values, through trampolines generated from each kernel's signature; a forward that
reads tensor values on the host is refused with the reason."""

from __future__ import annotations

import pytest
import torch
from infernetes.kernels.cpu import (
    attention,
    cache,
    elementwise,
    group_quant,
    int8_linear,
    native,
    replay,
    skinny_linear,
)

pytestmark = pytest.mark.skipif(replay.library() is None, reason="no C compiler")

GEN = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN).to(dtype)


def refill(*tensors: torch.Tensor) -> None:
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=GEN).to(t.dtype))


def test_every_kernel_signature_has_a_trampoline():
    assert set(replay.KINDS) == set(native.SIGNATURES)
    source = replay._source()
    for symbol in native.SIGNATURES:
        assert f"/* {symbol} */" in source


def test_a_layer_of_kernels_and_torch_ops_replays_on_new_values():
    """Every kernel a decode layer calls, with torch ops between them, recorded once and replayed
    after its inputs change: equal to running the layer again."""
    tokens, hidden, heads, kv_heads, dim, block = 2, 64, 4, 2, 16, 4
    x, residual, norm_w = randn(tokens, hidden), randn(tokens, hidden), randn(hidden)
    qkv_w = randn((heads + 2 * kv_heads) * dim, hidden, dtype=torch.float32)
    q8 = torch.randint(-127, 128, (3 * hidden, hidden), generator=GEN, dtype=torch.int8)
    q4 = torch.randint(0, 256, (hidden, hidden // 2), generator=GEN, dtype=torch.uint8)
    q_scale, q_offset = torch.rand(3 * hidden, hidden // 32), torch.rand(hidden, hidden // 32)
    q4_scale = torch.rand(hidden, hidden // 32)
    positions = torch.tensor([5, 9])
    cos_sin = randn(32, dim, dtype=torch.float32)
    k_cache, v_cache = torch.zeros(8, block, kv_heads, dim), torch.zeros(8, block, kv_heads, dim)
    slots = torch.tensor([5, 9 + block])
    tables = torch.tensor([[1, 0, 3, 0], [2, 4, 5, 6]], dtype=torch.int32)
    seq_lens = torch.tensor([6, 10], dtype=torch.int32)
    cu = torch.arange(tokens + 1, dtype=torch.int32)

    def layer() -> torch.Tensor:
        h, summed = elementwise.rms_norm(x, norm_w, 1e-5, residual)
        qkv = skinny_linear.linear(h.float(), qkv_w, None)  # a torch op, then a kernel
        q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        q, k = elementwise.rotary_embedding(
            positions,
            q.reshape(tokens, heads, dim),
            k.reshape(tokens, kv_heads, dim),
            cos_sin,
            True,
        )
        cache.store_kv(k, v.reshape(tokens, kv_heads, dim), k_cache, v_cache, slots)
        out = attention.paged_attention(q, k_cache, v_cache, tables, cu, seq_lens, 0.25)
        mixed = out.reshape(tokens, -1)[:, :hidden].to(torch.bfloat16) + summed
        up = int8_linear.linear(mixed, q8, q_scale, None, 8, None)
        down = group_quant.group_quant_linear(
            elementwise.silu_and_mul(up[:, : 2 * hidden]), q4, q4_scale, q_offset, 32, 4
        )
        return down + group_quant.dequantize(q4, q4_scale, None, 32, 4, torch.bfloat16)[:tokens]

    with torch.inference_mode():
        program = replay.record(layer)
        assert program.kernel_runs >= 3 and program.torch_ops >= 3
        called = {s for step in program.steps for s in getattr(step, "symbols", [])}
        assert called == set(native.SIGNATURES)  # every trampoline
        for _ in range(2):
            refill(x, residual, cos_sin, qkv_w)
            positions.copy_(positions + 1)
            got = program().clone()
            cached = k_cache.clone(), v_cache.clone()
            assert torch.equal(got, layer())
            assert torch.equal(cached[0], k_cache) and torch.equal(cached[1], v_cache)


def test_the_trampolines_pass_every_argument_in_place():
    """One call of each kernel recorded and replayed into the same outputs gives its bits again:
    a trampoline that mixed up two integers or the float arguments would not."""
    x, w, r = randn(3, 96), randn(96), randn(3, 96)
    with torch.inference_mode():
        program = replay.record(lambda: elementwise.rms_norm(x, w, 0.5, r))
        want = tuple(t.clone() for t in program.output)
        for t in program.output:
            t.zero_()
        program()
    assert all(torch.equal(a, b) for a, b in zip(program.output, want, strict=True))
    assert torch.equal(want[0], elementwise.rms_norm(x, w, 0.5, r)[0])


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.sum().item(),
        lambda t: t.tolist(),
        lambda t: t[t > 0],
        lambda t: t.nonzero(),
        lambda t: torch.tensor([1.0]) + t,
    ],
    ids=["item", "tolist", "mask", "nonzero", "host-tensor"],
)
def test_a_forward_that_reads_values_on_the_host_is_refused(read):
    t = randn(4, 8, dtype=torch.float32)
    with pytest.raises(replay.Refused, match="host"):
        replay.record(lambda: read(t))
    # nothing stays recording, and tolist answers as before
    assert getattr(native.recording, "tape", None) is None
    assert t.tolist()[0][0] == float(t[0, 0])


def test_a_kernel_that_fails_in_a_replay_raises_naming_it():
    key, value = randn(1, 2, 8), randn(1, 2, 8)
    k_cache, v_cache = (
        torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16),
        torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16),
    )
    slots = torch.tensor([3])
    program = replay.record(lambda: cache.store_kv(key, value, k_cache, v_cache, slots))
    slots.fill_(99)  # past the cache's 8 slots
    with pytest.raises(RuntimeError, match="replayed CPU kernel store_kv failed"):
        program()


def test_integer_indexing_replays_with_new_indices():
    table = randn(10, 4, dtype=torch.float32)
    ids = torch.tensor([1, 3])
    program = replay.record(lambda: table[ids] * 2)
    ids.copy_(torch.tensor([7, 0]))
    assert torch.equal(program(), table[ids] * 2)
