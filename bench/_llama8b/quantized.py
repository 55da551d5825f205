"""w4a16 and fp8: the same model as a pre-quantized checkpoint (its config.json declares GPTQ
4-bit with groups of 128, or fp8; ``--load-format dummy`` fills the packed int4 or fp8 weights),
single-stream decode against the bytes bound of the quantized weights and offline throughput,
each beside bf16's decode and throughput from the same run."""

from __future__ import annotations

import argparse

from bench._gpu import against_bound, copy_bandwidth, throughput_beside_bf16
from bench._llama8b.model import PartRunner, weight_bytes_per_token, write_model_dir


def measure(variant: str, run: PartRunner, args: argparse.Namespace, results: dict) -> None:
    """The variant's decode and throughput, and bf16's where this run has not measured them."""
    if "copy_bandwidth" not in results:
        results["copy_bandwidth"] = copy_bandwidth(1 << 20 if run.smoke else 1 << 30)
    if "decode" not in results:
        results["decode"] = run("decode")
    if "throughput-engine" not in results:
        results["throughput-engine"] = run("throughput-engine")
    model_dir = write_model_dir(run.tmp / f"llama-3.1-8b-shape-{variant}", run.smoke, variant)
    results[f"decode-{variant}"] = run("decode", model_dir, triton=True)
    results[f"throughput-{variant}"] = run("throughput-engine", model_dir, triton=True)


def report(variant: str, device_name: str, config: dict, results: dict) -> None:
    decode = results[f"decode-{variant}"]["decode_tokens_per_s"]
    per_token = weight_bytes_per_token(config, variant)
    limit = results["copy_bandwidth"] / per_token
    bf16 = results["decode"]["decode_tokens_per_s"]
    print(
        f"{variant}: decode {decode:.1f} tok/s single stream; weights read per token "
        f"{per_token / 1e9:.2f} GB; " + against_bound("copy-bandwidth limit", decode, limit)
    )
    print(f"  beside bf16 decode {bf16:.1f} tok/s: {decode / bf16:.2f}x")
    print(throughput_beside_bf16(results[f"throughput-{variant}"], results["throughput-engine"]))
