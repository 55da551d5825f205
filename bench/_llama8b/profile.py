"""profile: the GPU kernels of single-stream decode steps, by device time per step, to see where
a step goes (on an H100 the cuBLAS products took ~5.5 of ~6.8 ms)."""

from __future__ import annotations

import argparse

import torch

from bench._gpu import sync
from bench._llama8b.model import PartRunner, llm


def part_profile(args: argparse.Namespace, steps: int = 64, top: int = 15) -> dict:
    """Device time per decode step by kernel, from torch.profiler over `steps` single-stream steps."""
    from torch.profiler import ProfilerActivity, profile

    from infernetes import SamplingParams

    engine = llm(args)
    prompt = list(range(1000, 1128)) if not args.smoke else list(range(3, 35))
    engine.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )  # warm-up
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    with profile(activities=activities) as prof:
        engine.generate(
            [prompt], SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
        )
        sync()
    # device-side events only (kernels, copies): CPU-side ops report no device time of their own
    events = [
        e
        for e in prof.key_averages()
        if e.self_device_time_total > 0 and not e.key.startswith("aten::")
    ]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total_us = sum(e.self_device_time_total for e in events)
    return {
        "steps": steps,
        "device_ms_per_step": total_us / steps / 1e3,
        "kernels": [
            {
                "name": e.key[:80],
                "us_per_step": e.self_device_time_total / steps,
                "calls_per_step": e.count / steps,
            }
            for e in events[:top]
        ],
    }


PARTS = {"profile": part_profile}


def measure(run: PartRunner, args: argparse.Namespace, results: dict) -> None:
    results["profile"] = run("profile")


def report(device_name: str, config: dict, results: dict) -> None:
    profile = results["profile"]
    print(
        f"profile: {profile['device_ms_per_step']:.2f} ms of device time per single-stream decode step"
    )
    for row in profile["kernels"]:
        print(f"  {row['us_per_step']:8.1f} us  {row['calls_per_step']:5.1f} calls  {row['name']}")
