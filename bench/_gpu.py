"""What the GPU benchmarks share: the device, its copy bandwidth, CUDA-graph timing, a part run
in a process of its own, and the report lines that set a figure against a bound or beside bf16."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# Nominal HBM bandwidth (bytes/s) by device name, for the limit the issue states.
NOMINAL_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12, "L40S": 0.864e12}


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(num_bytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (each copy reads and writes `num_bytes`)."""
    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device=device())
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync()
    return 2 * num_bytes * iters / (time.perf_counter() - start)


def replayable(launch: Callable[[], object]) -> Callable[[], object]:
    """``launch`` captured in a CUDA graph, as the engine's decode steps run: timing it eagerly
    measures Python's launch overhead as much as the kernel. On a CPU (smoke runs) as it is."""
    launch()
    sync()
    if device().type != "cuda":
        return launch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    graph.replay()
    sync()
    return graph.replay


def seconds_per_call(step: Callable[[], object], iters: int) -> float:
    """The mean seconds of ``iters`` back-to-back calls of ``step``, to the device's end."""
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return (time.perf_counter() - start) / iters


def run_part(
    part: str, argv: list[str], model_dir: Path, smoke: bool, triton: bool = False, *, module: str
) -> dict:
    """Part ``part`` of benchmark ``module`` in a process of its own, its JSON result.
    ``triton``: with --smoke, on the Triton path (interpreted), where quantized layers keep
    their stored weights as they do on a GPU."""
    env = None
    if smoke and (part == "kernels" or triton):
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        if triton:
            env["VLLM_ATTENTION_BACKEND"] = "TRITON_ATTN"
    cmd = [sys.executable, "-m", module, *argv, "--part", part, "--model-dir", str(model_dir)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent
    )
    if proc.returncode:
        raise RuntimeError(f"part {part} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"{part}: {json.dumps(result)}", file=sys.stderr, flush=True
    )  # progress, and the raw figures
    return result


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the raw figures of every part as JSON to PATH (bench/gpu/run.sh's report)",
    )


def write_json(path: str | None, benchmark: str, device_name: str, argv: list[str], results: dict):
    """The raw figures of a run, with what produced them, for ``--json``."""
    if path:
        report = {"benchmark": benchmark, "device": device_name, "argv": argv, "results": results}
        Path(path).write_text(json.dumps(report, indent=2) + "\n")


def nominal(table: dict[str, float], device_name: str) -> float | None:
    """The figure of ``table`` for the device whose name contains its key."""
    return next((value for name, value in table.items() if name in device_name), None)


def against_bound(name: str, rate: float, bound: float) -> str:
    """``rate`` tok/s against the ``bound`` tok/s of the same run's device."""
    return f"vs {name} {bound:.1f} tok/s: {rate / bound:.1%}"


def throughput_beside_bf16(ours: dict, base: dict) -> str:
    return (
        f"  throughput {ours['output_tokens_per_s']:.0f} output tok/s beside bf16 "
        f"{base['output_tokens_per_s']:.0f}: "
        f"{ours['output_tokens_per_s'] / base['output_tokens_per_s']:.2f}x"
    )
