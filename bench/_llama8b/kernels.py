"""kernels: paged decode attention (Triton) bandwidth against the copy bandwidth."""

from __future__ import annotations

import argparse

import torch

from bench._gpu import copy_bandwidth, device, replayable, seconds_per_call
from bench._llama8b.model import PartRunner, model_config


def part_kernels(args: argparse.Namespace) -> dict:
    from infernetes.kernels import triton_backend
    from infernetes.kernels.testing import random_paged_batch

    config = model_config(args)
    shapes = [(1, 256)] if args.smoke else [(1, 32768), (16, 4096), (64, 4096), (256, 1024)]
    dtype = torch.float32 if args.smoke else torch.bfloat16
    copy_bw = copy_bandwidth(1 << 20 if args.smoke else 1 << 30)
    results = []
    for seqs, kv_len in shapes:
        batch = random_paged_batch(
            [1] * seqs,
            [kv_len] * seqs,
            config["num_attention_heads"],
            config["num_key_value_heads"],
            config["head_dim"],
            16,
            dtype,
            device=device(),
        )
        kv_bytes = (
            2 * seqs * kv_len * config["num_key_value_heads"] * config["head_dim"] * dtype.itemsize
        )
        step = replayable(lambda batch=batch: triton_backend.paged_attention(*batch.args()))
        seconds = seconds_per_call(step, 2 if args.smoke else 50)
        results.append(
            {
                "seqs": seqs,
                "kv_len": kv_len,
                "us": seconds * 1e6,
                "bandwidth_GBps": kv_bytes / seconds / 1e9,
                "fraction_of_copy": kv_bytes / seconds / copy_bw,
            }
        )
    return {"copy_bandwidth_GBps": copy_bw / 1e9, "attention": results}


PARTS = {"kernels": part_kernels}


def measure(run: PartRunner, args: argparse.Namespace, results: dict) -> None:
    results["kernels"] = run("kernels")


def report(device_name: str, config: dict, results: dict) -> None:
    k = results["kernels"]
    print(f"kernels: device copy bandwidth {k['copy_bandwidth_GBps']:.0f} GB/s")
    for row in k["attention"]:
        print(
            f"  decode attention {row['seqs']} seqs x {row['kv_len']} tokens: {row['us']:.0f} us, "
            f"{row['bandwidth_GBps']:.0f} GB/s = {row['fraction_of_copy']:.1%} of copy"
        )
