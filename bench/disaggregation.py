"""Disaggregated prefill (the NixlConnector) against one server doing both: time to first token
through the example P/D proxy (prefill server, NIXL read, decode server) and straight from one
server, same model, same kind of prompts (each prompt sent once, so no prefix-cache hit); and
NIXL's read rate between two processes over KV caches laid out as an engine's, through the
connector's own ``NixlPeer``.

    python -m bench disaggregation [--model PATH] [--num-prompts 6] [--prompt-len 512]

The default model is the demo's SmolLM2-135M-Instruct GGUF file, in float32. The servers run
on this machine's CPU, so the prefill and decode servers share its cores: the pair's TTFT is
the sum of both sides' work plus the transfer, never less than one server's.

Measured by ``python -m bench disaggregation`` (the defaults) on 2026-11-25, on the 2-core CPU
machine shared with other jobs (load average about 12): TTFT 40.5 s through the pair against
30.6 s from one server (medians of 6; 1.32x), and a NIXL read of 94 MB in 86 ms (1.10 GB/s).
docs/disaggregation.md says what the figures mean.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from infernetes.runtime.server.sse_reader import sse_lines

from bench._server import cli, free_port, wait_healthy

PROXY = Path(__file__).resolve().parents[1] / "examples" / "disagg_proxy.py"


def _serve(model: str, role: str, block_override: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {"kv_connector": "NixlConnector", "kv_role": role}
    process = subprocess.Popen(
        cli(
            "serve",
            model,
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--num-gpu-blocks-override",
            str(block_override),
            "--kv-transfer-config",
            json.dumps(config),
            "--port",
            str(port),
        ),
        env={**os.environ, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process)
    return process, url


def _wait_listening(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _ttft(url: str, prompt: list[int]) -> float:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as answer:
        for line in sse_lines(answer.iter_text()):
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - start
    raise RuntimeError(f"no token from {url}")


def _prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 20000) for _ in range(length)] for _ in range(count)]


def _compare_ttft(model: str, num_prompts: int, prompt_len: int) -> dict[str, float]:
    blocks = 4 * num_prompts * (prompt_len // 16 + 2)
    prefill, prefill_url = _serve(model, "kv_producer", blocks)
    decode, decode_url = _serve(model, "kv_consumer", blocks)
    proxy_port = free_port()
    command = [sys.executable, str(PROXY), "--prefill", prefill_url, "--decode", decode_url]
    proxy = subprocess.Popen(
        [*command, "--port", str(proxy_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    try:
        _wait_listening(proxy_url)
        _ttft(proxy_url, _prompts(1, prompt_len, 99)[0])  # warm-up: handshake, first forward
        _ttft(prefill_url, _prompts(1, prompt_len, 98)[0])
        pair = [_ttft(proxy_url, p) for p in _prompts(num_prompts, prompt_len, 1)]
        single = [_ttft(prefill_url, p) for p in _prompts(num_prompts, prompt_len, 2)]
    finally:
        for process in (proxy, decode, prefill):
            process.terminate()
            process.wait()
    return {"ttft_pd_s": statistics.median(pair), "ttft_single_s": statistics.median(single)}


# -- NIXL's read rate --------------------------------------------------------------------------

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 30, 128, 16, 3, 64  # SmolLM2-135M's KV, float32


def _caches() -> dict[str, tuple[Any, Any]]:
    import torch

    shape = (BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM)
    return {f"l{i}": (torch.randn(shape), torch.randn(shape)) for i in range(LAYERS)}


def _holder(port: int, ready: Any, done: Any) -> None:
    from infernetes.runtime.kv_transfer.nixl_peer import NixlPeer

    peer = NixlPeer("holder", 0, 1, BLOCK_SIZE, ("localhost", port), 600, ["UCX"])
    caches = _caches()  # (NIXL keeps no reference: they must outlive the reads)
    peer.register(caches)
    peer.held.hold([f"r{i}" for i in range(10)])
    ready.set()
    while not done.is_set():
        peer.take_sent()
        time.sleep(0.01)
    peer.close()
    del caches


def _read_rate() -> dict[str, float]:
    from infernetes.runtime.kv_transfer.nixl_peer import NixlPeer, RemoteSource

    context = mp.get_context("spawn")
    port = free_port()
    ready, done = context.Event(), context.Event()
    holder = context.Process(target=_holder, args=(port, ready, done))
    holder.start()
    ready.wait(300)
    reader = NixlPeer("reader", 0, 1, BLOCK_SIZE, ("localhost", free_port()), 600, ["UCX"])
    caches = _caches()
    reader.register(caches)
    blocks = list(range(BLOCKS))
    seconds = []
    for i in range(10):
        source = RemoteSource("localhost", port, "holder", f"r{i}", 1)
        start = time.perf_counter()
        reader.wait(reader.start_read(source, blocks, blocks))
        seconds.append(time.perf_counter() - start)
    done.set()
    holder.join()
    reader.close()
    del caches
    moved = 2 * LAYERS * BLOCKS * BLOCK_SIZE * HEADS * HEAD_DIM * 4
    best = min(seconds[1:])  # the first read makes the connection
    return {"read_bytes": moved, "read_s_best": best, "read_gb_per_s": moved / best / 1e9}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench disaggregation")
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=512)
    args = parser.parse_args(argv)
    if args.model is None:
        from infernetes.runtime.server.demo import demo_gguf

        args.model = str(demo_gguf())
    result = _read_rate()
    result |= _compare_ttft(args.model, args.num_prompts, args.prompt_len)
    result["ttft_ratio_pd_over_single"] = result["ttft_pd_s"] / result["ttft_single_s"]
    print(json.dumps(result, indent=2))
    return 0
