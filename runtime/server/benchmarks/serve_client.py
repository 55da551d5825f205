"""``infernetes bench serve``: drive a running OpenAI-compatible server with streamed requests
at a request rate (Poisson arrivals) and/or a concurrency cap, and report throughput, TTFT,
TPOT, ITL and end-to-end latency percentiles, as vLLM's serving benchmark does."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from infernetes.runtime.server.benchmarks.datasets import BenchRequest


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    latency: float = 0.0


def _has_text(line: bytes, key: bytes) -> bool:
    """Whether the SSE line's ``key`` holds a non-empty string, without decoding the JSON."""
    at = line.find(key)
    if at < 0:
        return False
    value = line[at + len(key) :].lstrip()
    return value.startswith(b'"') and not value.startswith(b'""')


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    request: BenchRequest,
    chat: bool,
    ignore_eos: bool,
    headers: dict[str, str],
) -> RequestResult:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.output_len,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": ignore_eos,
        "stream_options": {"include_usage": True},
    }
    if chat:
        prompt = request.prompt if isinstance(request.prompt, str) else None
        if prompt is None:
            raise ValueError("the chat endpoint needs text prompts (use --dataset-name sharegpt)")
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = request.prompt
    result = RequestResult(prompt_len=request.prompt_len)
    start = last = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            text_key = b'"content":' if chat else b'"text":'
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                # Parsing every chunk would cost this client as much CPU as the server spends
                # producing it; only the usage and error events are decoded.
                if b'"usage"' in line or b'"error"' in line:
                    event = json.loads(line[6:])
                    if event.get("error"):
                        result.error = str(event["error"].get("message"))
                        return result
                    if event.get("usage"):
                        result.output_tokens = event["usage"]["completion_tokens"]
                if not _has_text(line, text_key):
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
        result.latency = time.perf_counter() - start
        result.success = result.output_tokens > 0
        if not result.success:
            result.error = "no tokens were generated"
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _arrivals(count: int, request_rate: float, seed: int):
    """Yields request indexes at Poisson-process times (all at once for an infinite rate)."""
    rng = random.Random(seed)
    for index in range(count):
        yield index
        if request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(request_rate))


async def run_benchmark(
    base_url: str,
    endpoint: str,
    model: str,
    requests: list[BenchRequest],
    *,
    request_rate: float = float("inf"),
    max_concurrency: int | None = None,
    ignore_eos: bool = True,
    api_key: str | None = None,
    seed: int = 0,
) -> tuple[list[RequestResult], float]:
    url = base_url.rstrip("/") + endpoint
    chat = endpoint.endswith("/chat/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0)
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(request: BenchRequest) -> RequestResult:
            if limit is None:
                return await _send(session, url, model, request, chat, ignore_eos, headers)
            async with limit:
                return await _send(session, url, model, request, chat, ignore_eos, headers)

        start = time.perf_counter()
        tasks = []
        async for index in _arrivals(len(requests), request_rate, seed):
            tasks.append(asyncio.create_task(one(requests[index])))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return list(results), duration


def summarize(
    results: list[RequestResult], duration: float, percentiles: list[float]
) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    summary: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": sum(r.prompt_len for r in ok),
        "total_output_tokens": sum(r.output_tokens for r in ok),
    }
    summary["request_throughput"] = len(ok) / duration if duration else 0.0
    summary["output_throughput"] = summary["total_output_tokens"] / duration if duration else 0.0
    summary["total_token_throughput"] = (
        (summary["total_input_tokens"] + summary["total_output_tokens"]) / duration
        if duration
        else 0.0
    )
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
        "itl": [x for r in ok for x in r.itls],
        "e2el": [r.latency for r in ok],
    }
    for name, values in series.items():
        data = np.array(values or [0.0]) * 1000.0
        summary[f"mean_{name}_ms"] = float(np.mean(data))
        summary[f"median_{name}_ms"] = float(np.median(data))
        summary[f"std_{name}_ms"] = float(np.std(data))
        for p in percentiles:
            summary[f"p{p:g}_{name}_ms"] = float(np.percentile(data, p))
    summary["errors"] = sorted({r.error for r in results if r.error})[:5]
    return summary


TITLES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}


def format_report(summary: dict[str, Any], percentiles: list[float], metrics: list[str]) -> str:
    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]

    def row(label: str, value: Any) -> None:
        lines.append(
            f"{label:<40}{value:<10.2f}" if isinstance(value, float) else f"{label:<40}{value:<10}"
        )

    row("Successful requests:", summary["completed"])
    row("Failed requests:", summary["failed"])
    row("Benchmark duration (s):", summary["duration_s"])
    row("Total input tokens:", summary["total_input_tokens"])
    row("Total generated tokens:", summary["total_output_tokens"])
    row("Request throughput (req/s):", summary["request_throughput"])
    row("Output token throughput (tok/s):", summary["output_throughput"])
    row("Total Token throughput (tok/s):", summary["total_token_throughput"])
    for name in metrics:
        lines.append("{s:{c}^50}".format(s=f" {TITLES[name]} ", c="-"))
        upper = name.upper()
        row(f"Mean {upper} (ms):", summary[f"mean_{name}_ms"])
        row(f"Median {upper} (ms):", summary[f"median_{name}_ms"])
        for p in percentiles:
            row(f"P{p:g} {upper} (ms):", summary[f"p{p:g}_{name}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)
