"""The CPU attention path: `paged_attention`'s torch reference against dense attention over the
same keys and values already laid out contiguously (what attention costs without paging).

    python -m bench kernels_reference_cpu [--threads N]

Prints milliseconds per call and the paged/dense ratio for decode, prefill and mixed batches of a
small Llama-like layer (8 query heads, 2 kv heads, head_dim 64, block size 16).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from infernetes.kernels.reference.attention import paged_attention
from infernetes.kernels.testing import random_paged_batch

CASES = {
    "decode 64 x 200": ([1] * 64, [200] * 64),
    "prefill 4 x 128": ([128] * 4, [128] * 4),
    "mixed 32 decodes x 300 + prefill 64": ([1] * 32 + [64], [300] * 32 + [64]),
}


def _best_ms(fn, repeats: int = 30) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):  # the best run: the machine is shared
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _dense(batch) -> list:
    """Per sequence: q `[1, H, Lq, D]`, contiguous k/v `[1, H, Lk, D]`, causal mask."""
    block_size = batch.k_cache.shape[1]
    group = batch.query.shape[1] // batch.k_cache.shape[2]
    cu = batch.cu_seqlens_q.tolist()
    items = []
    for b, kv_len in enumerate(batch.seq_lens.tolist()):
        blocks = batch.block_tables[b, : -(-kv_len // block_size)].long()
        k = (
            batch.k_cache[blocks]
            .flatten(0, 1)[:kv_len]
            .transpose(0, 1)
            .repeat_interleave(group, 0)[None]
        )
        v = (
            batch.v_cache[blocks]
            .flatten(0, 1)[:kv_len]
            .transpose(0, 1)
            .repeat_interleave(group, 0)[None]
        )
        q = batch.query[cu[b] : cu[b + 1]].transpose(0, 1)[None].contiguous()
        q_len = q.shape[2]
        mask = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - q_len, kv_len)[:, None]
        items.append((q, k.contiguous(), v.contiguous(), mask))
    return items


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench kernels_reference_cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{'case':40s} {'paged ms':>9s} {'dense ms':>9s} {'ratio':>6s}")
    for name, (q_lens, seq_lens) in CASES.items():
        batch = random_paged_batch(q_lens, seq_lens, 8, 2, 64, 16, torch.float32)
        dense = _dense(batch)
        paged_ms = _best_ms(lambda batch=batch: paged_attention(*batch.args()))
        dense_ms = _best_ms(
            lambda dense=dense: [
                F.scaled_dot_product_attention(q, k, v, attn_mask=m) for q, k, v, m in dense
            ]
        )
        print(f"{name:40s} {paged_ms:9.2f} {dense_ms:9.2f} {paged_ms / dense_ms:6.2f}")
    return 0
