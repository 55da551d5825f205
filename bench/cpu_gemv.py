"""Decode's linear layers on dense float32/bfloat16 weights on the CPU: the few-row kernel
(kernels/cpu/skinny_linear.c) against torch's path for the same layer (``F.linear`` at float32,
the oneDNN-packed weight at bfloat16, as the engine ran them before the kernel).

    python -m bench cpu_gemv [--threads N] [--rows 1 4 8] [--dtypes float32 bfloat16]

The layers are a Qwen2.5-0.5B's (as in ``cpu_quant_linear``); each call reads the next of several
copies of the layer, together past the caches, so every call streams its weight from memory as a
decode step does. Prints milliseconds per call (best of the repeats), the ratio, and each path's
reading rate over the weight's bytes against the copy bandwidth measured in the same run (bytes
read plus bytes written per second of a large tensor copy): the bound a decode step can reach.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from infernetes.kernels.cpu import packed_linear, skinny_linear

from bench.cpu_quant_linear import LAYERS, _best_ms, _copies, copy_bandwidth


def run_layer(name: str, inputs: int, outputs: int, rows: int, dtype, bound: float, repeats: int):
    gen = torch.Generator().manual_seed(0)
    one = torch.randn(outputs, inputs, generator=gen).to(dtype)
    weight_bytes = one.numel() * one.element_size()
    weights = [one.clone() for _ in range(_copies(weight_bytes))]
    x = torch.randn(rows, inputs, generator=gen).to(dtype)
    # measured where the engine's rule sends the product to torch too (one float32 row on Intel)
    assert skinny_linear.built(), "the kernel is not built here (no C compiler?)"
    kernel_ms = _best_ms([lambda w=w: skinny_linear.linear(x, w, None) for w in weights], repeats)
    packed = [packed_linear.pack_weight(w) for w in weights] if dtype == torch.bfloat16 else []
    if packed and all(p is not None for p in packed):
        del weights
        torch_calls = [lambda p=p: packed_linear.linear(x, p, None) for p in packed]
    else:
        torch_calls = [lambda w=w: F.linear(x, w) for w in weights]
    torch_ms = _best_ms(torch_calls, repeats)
    rate, torch_rate = weight_bytes / kernel_ms / 1e6, weight_bytes / torch_ms / 1e6
    print(
        f"{name:9s} {rows:>4d} {str(dtype).removeprefix('torch.'):>8s} {kernel_ms:9.3f} "
        f"{torch_ms:9.3f} {torch_ms / kernel_ms:7.2f}x {rate:7.1f} {rate / bound:6.0%} "
        f"{torch_rate:7.1f} {torch_rate / bound:6.0%}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu_gemv")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bound = copy_bandwidth()
    print(f"threads {args.threads}; copy bandwidth {bound:.1f} GB/s (read + write)")
    print(
        f"{'layer':9s} {'rows':>4s} {'dtype':>8s} {'kernel ms':>9s} {'torch ms':>9s} "
        f"{'speedup':>8s} {'GB/s':>7s} {'of copy':>6s} {'torch':>7s} {'of copy':>6s}"
    )
    for layer in args.layers:
        inputs, outputs = LAYERS[layer]
        for dtype_name in args.dtypes:
            for rows in args.rows:
                run_layer(
                    layer, inputs, outputs, rows, getattr(torch, dtype_name), bound, args.repeats
                )
    return 0
