"""The servers of the ``cpu_llamacpp`` bench, driven alike: ``infernetes serve`` and llama.cpp's
``llama-server --parallel N --cont-batching``, both loaded by one client (streamed
``/v1/completions`` of the same token-id prompts), and their process trees' idle CPU
seconds and memory."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import psutil

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


async def _one(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], output_len: int
) -> tuple[float, int]:
    """(seconds to the first token, tokens generated) of one streamed completion. Every chunk
    that carries a choice is a step's token: random weights mostly pick ids whose text is empty,
    so the text cannot say when the first token came."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices"):
                ttft = time.perf_counter() - start
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    if ttft is None or tokens == 0:
        raise RuntimeError("a request generated no tokens")
    return ttft, tokens


async def _drive(
    url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int
) -> tuple[list[tuple[float, int]], float]:
    limit = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=3600)
    # A connection per request: llama-server's HTTP library closes idle keep-alive connections,
    # and a request sent on one the server has just closed fails.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def limited(prompt: list[int]) -> tuple[float, int]:
            async with limit:
                return await _one(session, url, model, prompt, output_len)

        start = time.perf_counter()
        results = await asyncio.gather(*(limited(p) for p in prompts))
        return list(results), time.perf_counter() - start


def load(
    url: str, model: str, concurrency: int, input_len: int, output_len: int, seed: int
) -> LoadFigures:
    """``2 * concurrency`` (at least 4) prompts of ``input_len`` random token ids, each asking
    for ``output_len`` tokens, at most ``concurrency`` at a time. Each load gets its own
    ``seed``: prompts seen before would be served from either engine's prefix cache."""
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(100, 500) for _ in range(input_len)] for _ in range(max(4, 2 * concurrency))
    ]
    results, duration = asyncio.run(_drive(url, model, prompts, output_len, concurrency))
    ttfts = [ttft * 1000 for ttft, _ in results]
    return LoadFigures(
        sum(tokens for _, tokens in results) / duration,
        float(np.percentile(ttfts, 50)),
        float(np.percentile(ttfts, 99)),
    )
