"""The batched LoRA kernels (shrink/expand by slot per token) against their torch reference, and
the reference against a per-token loop written out (under TRITON_INTERPRET=1 on a CPU)."""

import pytest
import torch

pytest.importorskip("triton")

from infernetes.kernels import triton_backend as tk
from infernetes.kernels.reference import lora as ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}

CASES = [
    # tokens, K (input), R (rank), N (output), slots, dtype
    (7, 64, 8, 48, 3, torch.float32),
    (5, 100, 16, 70, 2, torch.float16),  # sizes that are not powers of two
    (9, 256, 4, 200, 4, torch.bfloat16),
    (1, 32, 1, 16, 1, torch.float32),  # rank one, one decode token
]


def _indices(tokens: int, slots: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, slots, (tokens,), generator=g)
    idx[0] = -1 if tokens > 1 else 0  # the base model and an adapter side by side
    return idx.to(DEVICE)


def _loop_delta(x, a_stack, b_stack, indices):
    rows = []
    for t, slot in enumerate(indices.tolist()):
        if slot < 0:
            rows.append(torch.zeros(b_stack.shape[1], dtype=torch.float32, device=x.device))
        else:
            rows.append(b_stack[slot].float() @ (a_stack[slot].float() @ x[t].float()))
    return torch.stack(rows)


@pytest.mark.parametrize(("tokens", "k", "r", "n", "slots", "dtype"), CASES)
def test_lora_kernels_match_reference(tokens, k, r, n, slots, dtype):
    torch.manual_seed(0)
    x = torch.randn(tokens, k, dtype=dtype, device=DEVICE)
    a = (torch.randn(slots, r, k, device=DEVICE) / k**0.5).to(dtype)
    b = torch.randn(slots, n, r, dtype=dtype, device=DEVICE)
    indices = _indices(tokens, slots, seed=tokens)
    s_ref = ref.lora_shrink(x, a, indices)
    s_tri = tk.lora_shrink(x, a, indices)
    torch.testing.assert_close(s_tri.float(), s_ref.float(), atol=TOL[dtype], rtol=TOL[dtype])

    offset, width = 5, n + 12  # the slice of a fused output (q of qkv, gate of gate_up)
    base = torch.randn(tokens, width, dtype=dtype, device=DEVICE)
    out_ref, out_tri = base.clone(), base.clone()
    ref.lora_expand(s_ref, b, indices, out_ref, offset)
    tk.lora_expand(s_ref, b, indices, out_tri, offset)
    torch.testing.assert_close(out_tri.float(), out_ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    # untouched outside the slice and on tokens without an adapter
    assert torch.equal(out_tri[:, :offset], base[:, :offset])
    assert torch.equal(out_tri[:, offset + n :], base[:, offset + n :])
    base_rows = indices < 0
    assert torch.equal(out_tri[base_rows], base[base_rows])


def test_reference_is_the_per_token_product():
    torch.manual_seed(1)
    x = torch.randn(6, 24, dtype=torch.float64)
    a = torch.randn(3, 4, 24, dtype=torch.float64)
    b = torch.randn(3, 10, 4, dtype=torch.float64)
    indices = torch.tensor([2, -1, 0, 2, 1, -1])
    out = torch.zeros(6, 10, dtype=torch.float64)
    ref.lora_expand(ref.lora_shrink(x, a, indices), b, indices, out, 0)
    torch.testing.assert_close(out.float(), _loop_delta(x, a, b, indices))
