"""A Llama-3.1-8B-shaped model (`--load-format dummy`, bf16) on one NVIDIA GPU.

    python -m bench gpu_llama8b [--parts decode,throughput,kernels,w4a16,fp8] [--requests 256]
    python -m bench.gpu_llama8b --smoke      # the same code on tiny shapes, on the CPU (a dry run)

Three measurements, each against a baseline taken in the same run on the same device:

1. decode: one request, tokens/s of the decode phase, against the memory-bandwidth limit
   (weight bytes read per token / bandwidth), both for the device's nominal bandwidth and for the
   device-to-device copy bandwidth measured here; and the same with --enforce-eager, so the CUDA
   graphs' gain shows as a ratio.
2. throughput: 256 requests with random input and output lengths of 100-1024 tokens (EOS ignored):
   output tokens/s of infernetes against transformers' batched `generate` on the same model shape.
3. kernels: paged decode attention (Triton) bandwidth against the copy bandwidth.
4. profile (opt-in, ``--parts profile``): the GPU kernels of single-stream decode steps, by time
   per step, to see where a step goes (on an H100 the cuBLAS products took ~5.5 of ~6.8 ms).
5. w4a16 and fp8 (opt-in, ``--parts w4a16,fp8``): the same model as a pre-quantized checkpoint
   (its config.json declares GPTQ 4-bit with groups of 128, or fp8; ``--load-format dummy`` fills
   the packed int4 or fp8 weights), single-stream decode against the bytes bound of the quantized
   weights and offline throughput, each beside bf16's decode and throughput from the same run.

One module each, in bench/_llama8b/. Each part runs in its own process so one model's memory does not shape the next one's. Without a
GPU (and without --smoke) the benchmark says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

from bench._gpu import add_json_option, write_json
from bench._llama8b import decode, kernels, profile, quantized, throughput
from bench._llama8b.model import LLAMA_31_8B, QUANTIZED, TINY, PartRunner, write_model_dir

PARTS = ("decode", "throughput", "kernels", "profile", "w4a16", "fp8")
DEFAULT_PARTS = ("decode", "throughput", "kernels")
# Each benchmark's measurement, in the order they run.
MEASURE = {
    "decode": decode.measure,
    "kernels": kernels.measure,
    "profile": profile.measure,
    "throughput": throughput.measure,
    **{variant: partial(quantized.measure, variant) for variant in QUANTIZED},
}
# Each benchmark's report, in the order they print.
REPORT = {
    "decode": decode.report,
    "throughput": throughput.report,
    **{variant: partial(quantized.report, variant) for variant in QUANTIZED},
    "kernels": kernels.report,
    "profile": profile.report,
}
# What one process runs for ``--part`` (internal).
PART_FUNCTIONS = {**decode.PARTS, **throughput.PARTS, **kernels.PARTS, **profile.PARTS}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu_llama8b", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated subset of {', '.join(PARTS)} (default: all but profile)",
    )
    parser.add_argument(
        "--requests", type=int, default=256, help="offline throughput: number of requests"
    )
    parser.add_argument(
        "--hf-requests",
        type=int,
        default=64,
        help="requests transformers generates (a subset: it is slow); tok/s is compared",
    )
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--decode-tokens", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--engine-args",
        default="{}",
        help="JSON of extra LLM keyword arguments, e.g. '{\"enforce_eager\": true}'",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU: checks the script runs"
    )
    parser.add_argument(
        "--part", choices=tuple(PART_FUNCTIONS), help=argparse.SUPPRESS
    )  # internal: run one part in this process, print JSON
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:  # small enough for the CPU
        args.requests, args.hf_requests, args.hf_batch_size = 6, 6, 3
        args.min_len, args.max_len, args.decode_tokens, args.max_model_len = 8, 24, 16, 256
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(
            f"--parts: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}"
        )
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.part:
        print(json.dumps(PART_FUNCTIONS[args.part](args)))
        return 0
    if not torch.cuda.is_available() and not args.smoke:
        print(
            "gpu_llama8b: no CUDA device here; skipped (run on an NVIDIA GPU, or --smoke for a dry run)"
        )
        return 0
    parts = args.parts.split(",")
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)"
    passthrough = [a for a in argv if a not in ("--part",)]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp) / "llama-3.1-8b-shape", args.smoke)
        run = PartRunner(passthrough, model_dir, Path(tmp), args.smoke)
        for name, measure in MEASURE.items():
            if name in parts:
                measure(run, args, results)
    print(f"device: {device_name}")
    config = TINY if args.smoke else LLAMA_31_8B
    for name, report in REPORT.items():
        if name in parts:
            report(device_name, config, results)
    write_json(args.json, "gpu_llama8b", device_name, argv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
