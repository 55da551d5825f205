"""Group-quantized linear layers on the CPU (`ops.group_quant_linear`): the C kernel against
dequantizing the whole weight then `F.linear` (the reference), and against a dense layer in the
activations' dtype (bf16 as the engine runs it, packed once for oneDNN; f32 through `F.linear`).

    python -m bench cpu_quant_linear [--threads N] [--rows 1 32] [--bits 4 8] [--group 32]
                                     [--scale-dtype float16|float32]

The layers are a Qwen2.5-0.5B's (896 -> 4864 MLP up, 4864 -> 896 down, 896 -> 1152 fused QKV,
896 -> 151936 LM head). Each call reads the next of several copies of the layer, together larger
than the caches, so every call streams its weight from memory as a model's decode step does.
Prints milliseconds per call (best of the repeats), the ratios, and the kernel's reading rate
over the weight's bytes (integers, scales, offsets: float16 as GGUF's blocks keep them, or
float32 as GPTQ/AWQ's are held) against the machine's copy bandwidth measured
in the same run (a large torch tensor copy; bytes read plus bytes written per second).

Measured here (2 shared cores of an AVX512-BF16 EPYC under a load average near 10, so the
figures move by tens of percent between runs; ``--threads 1``): at one row the 4-bit kernel ran
1.3-1.5x a dense bf16 layer (2.8x on the LM head) and 2.8-3.6x a dense f32 one, 60-240x
dequantize-then-``F.linear``; 8-bit 1.2-1.4x bf16. 4-bit reads 14-16 GB/s of its weight bytes
(about 65-75% of the copy rate measured beside it; the unpacking, not memory, bounds one
thread), 8-bit 19-23 GB/s. At 32 rows (torch's GEMM on dequantized tiles) bf16 is 0.5-0.75x the
packed dense layer, f32 about even. Two threads gave 1.5-2x on the kernel when the second core
was free, and far less when it was not.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from infernetes.kernels import ops
from infernetes.kernels.cpu import packed_linear
from infernetes.kernels.reference import group_quant as reference

LAYERS = {
    "mlp up": (896, 4864),
    "mlp down": (4864, 896),
    "qkv": (896, 1152),
    "lm head": (896, 151936),
}
STREAM_BYTES = 384 << 20  # copies per variant add up to this: past the last-level cache


def _best_ms(calls: list[Callable[[], object]], repeats: int) -> float:
    """Best time of a call, cycling through `calls` (one per copy of the weight)."""
    calls[0]()
    best = float("inf")
    for i in range(repeats):
        call = calls[(i + 1) % len(calls)]
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def copy_bandwidth() -> float:
    """GB/s of a large tensor copy (bytes read plus bytes written)."""
    source = torch.ones(STREAM_BYTES // 2, dtype=torch.uint8)
    target = torch.empty_like(source)
    ms = _best_ms([lambda: target.copy_(source)], 5)
    return 2 * source.numel() / ms / 1e6


def _copies(bytes_each: int) -> int:
    return max(2, -(-STREAM_BYTES // bytes_each))


def _weights(
    inputs: int,
    outputs: int,
    group: int,
    bits: int,
    count: int,
    seed: int,
    scale_dtype: torch.dtype = torch.float16,
) -> list:
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(0, 256, (outputs, inputs * bits // 8), generator=gen, dtype=torch.uint8)
    if bits == 8:
        qweight = qweight.view(torch.int8)
    scale = (torch.rand(outputs, inputs // group, generator=gen) / 64).to(scale_dtype)
    offset = -8 * scale if bits == 4 else None
    # copies, not views: each its own memory
    return [
        (qweight.clone(), scale.clone(), None if offset is None else offset.clone())
        for _ in range(count)
    ]


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def run_layer(
    name: str,
    inputs: int,
    outputs: int,
    bits: int,
    group: int,
    rows: int,
    dtype,
    bound: float,
    repeats: int,
    scale_dtype: torch.dtype,
) -> None:
    probe = _weights(inputs, outputs, group, bits, 1, 0, scale_dtype)[0]
    quant_bytes = _nbytes(*probe)
    weights = _weights(inputs, outputs, group, bits, _copies(quant_bytes), 0, scale_dtype)
    x = torch.randn(rows, inputs).to(dtype)
    kernel = [lambda w=w: ops.group_quant_linear(x, w[0], w[1], w[2], group, bits) for w in weights]
    kernel_ms = _best_ms(kernel, repeats)
    # The reference dequantizes on every call: a few calls are plenty.
    slow = [
        lambda w=w: reference.group_quant_linear(x, w[0], w[1], w[2], group, bits)
        for w in weights[:2]
    ]
    reference_ms = _best_ms(slow, max(2, repeats // 4))
    dense_one = reference.dequantize(*probe, group, bits, dtype)
    del weights, slow, kernel
    dense_copies = [dense_one.clone() for _ in range(_copies(_nbytes(dense_one)))]
    if dtype == torch.bfloat16:
        packed = [packed_linear.pack_weight(w) for w in dense_copies]
        if all(p is not None for p in packed):
            dense_copies = packed
            dense = [lambda p=p: packed_linear.linear(x, p, None) for p in packed]
        else:
            dense = [lambda w=w: F.linear(x, w) for w in dense_copies]
    else:
        dense = [lambda w=w: F.linear(x, w) for w in dense_copies]
    dense_ms = _best_ms(dense, repeats)
    rate = quant_bytes / kernel_ms / 1e6
    print(
        f"{name:9s} {bits:>4d} {rows:>4d} {str(dtype).removeprefix('torch.'):>8s} "
        f"{kernel_ms:9.3f} {reference_ms / kernel_ms:9.1f}x {dense_ms:9.3f} "
        f"{dense_ms / kernel_ms:8.2f}x {rate:7.1f} {rate / bound:6.0%}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu_quant_linear")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--group", type=int, default=32)
    parser.add_argument("--scale-dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bound = copy_bandwidth()
    print(
        f"threads {args.threads}; copy bandwidth {bound:.1f} GB/s (read + write); group "
        f"{args.group}; {args.scale_dtype} scales"
    )
    print(
        f"{'layer':9s} {'bits':>4s} {'rows':>4s} {'dtype':>8s} {'kernel ms':>9s} {'vs deq+lin':>10s} "
        f"{'dense ms':>9s} {'vs dense':>9s} {'GB/s':>7s} {'of copy':>6s}"
    )
    for layer in args.layers:
        inputs, outputs = LAYERS[layer]
        for bits in args.bits:
            for rows in args.rows:
                for dtype_name in args.dtypes:
                    run_layer(
                        layer,
                        inputs,
                        outputs,
                        bits,
                        args.group,
                        rows,
                        getattr(torch, dtype_name),
                        bound,
                        args.repeats,
                        getattr(torch, args.scale_dtype),
                    )
    return 0
