"""The servers of the ``cpu_llamacpp`` bench, driven alike: ``infernetes serve`` and llama.cpp's
``llama-server --parallel N --cont-batching``, both loaded by ``infernetes bench serve``'s client
(streamed ``/v1/completions`` of the same token-id prompts), and their process trees' idle CPU
seconds and memory."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from infernetes.runtime.server.benchmarks.datasets import random_requests
from infernetes.runtime.server.benchmarks.serve_client import run_benchmark, summarize

from bench._server import cli, free_port, wait_healthy

IDLE_WINDOW_S = 10.0


@dataclass
class LoadFigures:
    output_tps: float
    ttft_p50_ms: float
    ttft_p99_ms: float


def tree_cpu_seconds(pid: int) -> float:
    root = psutil.Process(pid)
    return sum((t := p.cpu_times()).user + t.system for p in [root, *root.children(recursive=True)])


def tree_memory_bytes(pid: int) -> int:
    """Proportional set size of the process tree (shared libraries counted once across it)."""
    root = psutil.Process(pid)
    return sum(p.memory_full_info().pss for p in [root, *root.children(recursive=True)])


def idle_cpu_per_10s(pid: int, window_s: float) -> float:
    time.sleep(1.0)  # past the spin of the last request's threads
    before = tree_cpu_seconds(pid)
    time.sleep(window_s)
    return (tree_cpu_seconds(pid) - before) * IDLE_WINDOW_S / window_s


@contextmanager
def running(
    command: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of a server started with ``command`` plus its port, until the block ends."""
    port = free_port()
    with open(log, "ab") as log_file:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, process, timeout=900)
            yield url, process.pid
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def infernetes_command(model: str, dtype: str, max_model_len: int) -> list[str]:
    return cli(
        "serve",
        model,
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        "0",
        "--disable-uvicorn-access-log",
        "--disable-log-stats",
    )


def llama_server_command(
    binary: Path, gguf: Path, threads: int, parallel: int, context_per_slot: int
) -> list[str]:
    return [
        str(binary),
        "-m",
        str(gguf),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--parallel",
        str(parallel),
        "--cont-batching",
        "-c",
        str(parallel * context_per_slot),
    ]


def load(url: str, model: str, concurrency: int, input_len: int, output_len: int) -> LoadFigures:
    """``2 * concurrency`` (at least 4) requests of ``input_len`` random token ids, each asking for
    ``output_len`` tokens, at most ``concurrency`` at a time."""
    requests = random_requests(
        max(4, 2 * concurrency),
        input_len,
        output_len,
        0.0,
        500,
        seed=0,
        special_ids=set(range(100)),
    )
    results, duration = asyncio.run(
        run_benchmark(url, "/v1/completions", model, requests, max_concurrency=concurrency)
    )
    summary = summarize(results, duration, [50, 99])
    if summary["failed"]:
        raise RuntimeError(f"{summary['failed']} requests failed: {summary['errors']}")
    return LoadFigures(
        summary["output_throughput"], summary["median_ttft_ms"], summary["p99_ttft_ms"]
    )
