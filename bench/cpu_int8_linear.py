"""Decode's linear layers on GGUF Q8_0 and Q4_1 blocks: int8 activations
(kernels/cpu/int8_linear.c, as llama.cpp computes them) against the same weights with float
activations (group_quant.c's paths, which the engine ran before).

    python -m bench cpu_int8_linear [--threads N] [--rows 1 4 8] [--bits 8 4]
                                    [--dtypes bfloat16 float32] [--scale-dtype float16|float32]

The layers are a Qwen2.5-0.5B's (as in ``cpu_quant_linear``), each call on the next of several
copies so that every call streams its weight from memory. Prints milliseconds per call (best of
the repeats), the speedup, and each path's reading rate over the weight's bytes (integers, float16
scales and offsets as GGUF stores them) against the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse

import torch
from infernetes.kernels.cpu import group_quant, int8_linear

from bench.cpu_quant_linear import LAYERS, _best_ms, _copies, _nbytes, _weights, copy_bandwidth


def run_layer(name, inputs, outputs, bits, rows, dtype, bound, repeats, scale_dtype):
    probe = _weights(inputs, outputs, 32, bits, 1, 0, scale_dtype)[0]
    weight_bytes = _nbytes(*probe)
    weights = _weights(inputs, outputs, 32, bits, _copies(weight_bytes), 0, scale_dtype)
    x = torch.randn(rows, inputs).to(dtype)
    # measured past the engine's row limit too: `handles` is asked about one row
    assert int8_linear.handles(x[:1], *probe, bits, 1), "the kernel is not built here"
    int8_ms = _best_ms(
        [lambda w=w: int8_linear.linear(x, *w, bits, None) for w in weights], repeats
    )
    float_ms = _best_ms(
        [lambda w=w: group_quant.group_quant_linear(x, *w, 32, bits) for w in weights], repeats
    )
    rate, float_rate = weight_bytes / int8_ms / 1e6, weight_bytes / float_ms / 1e6
    print(
        f"{name:9s} {bits:>4d} {rows:>4d} {str(dtype).removeprefix('torch.'):>8s} {int8_ms:9.3f} "
        f"{float_ms:9.3f} {float_ms / int8_ms:7.2f}x {rate:7.1f} {rate / bound:6.0%} "
        f"{float_rate:7.1f} {float_rate / bound:6.0%}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu_int8_linear")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 4])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--scale-dtype", choices=["float16", "float32"], default="float16")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bound = copy_bandwidth()
    print(f"threads {args.threads}; copy bandwidth {bound:.1f} GB/s (read + write)")
    print(
        f"{'layer':9s} {'bits':>4s} {'rows':>4s} {'dtype':>8s} {'int8 ms':>9s} {'float ms':>9s} "
        f"{'speedup':>8s} {'GB/s':>7s} {'of copy':>6s} {'float':>7s} {'of copy':>6s}"
    )
    for layer in args.layers:
        inputs, outputs = LAYERS[layer]
        for bits in args.bits:
            for dtype_name in args.dtypes:
                for rows in args.rows:
                    dtype = getattr(torch, dtype_name)
                    scale_dtype = getattr(torch, args.scale_dtype)
                    run_layer(
                        layer, inputs, outputs, bits, rows, dtype, bound, args.repeats, scale_dtype
                    )
    return 0
