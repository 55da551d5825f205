"""Soak: resident memory of the API process and of the engine-core process under a steady load.

``infernetes serve`` runs on a generated tiny Llama (the demo model; or ``--model``) with the
engine core in its own process (the default, VLLM_ENABLE_V1_MULTIPROCESSING). For ``--minutes``,
``--concurrency`` clients send a mix of requests (``bench/_soak_load.py``: chat and completions,
streamed and not, sampled with seeds and penalties, logprobs, stop strings, n > 1, structured
output, streams cut by the client, prompts over the context length). Every ``--interval``
seconds the RSS of both processes is sampled and printed. The report gives, per process, the RSS
at the start and end and its growth per minute after ``--warmup`` minutes: the least-squares
slope over the samples taken after the warm-up (a leak shows as a steady slope; allocator
caches and prefix-cache fill-up level off during the warm-up).

Then a large-prompt phase (``--large-prompt-mb``, 0 to skip): one completions request whose
prompt is that many MB of text (a 400: far over the context length), with the API process's RSS
before it, right after it, and after a few more normal requests.

    python -m bench soak [--minutes 3] [--warmup 1] [--interval 5] [--concurrency 6]
                         [--large-prompt-mb 10] [--model DIR] [--smoke]

``--smoke`` is a dry run of the whole thing in well under a minute (short soak, 1 MB prompt).
The exit status is 1 when a request got a 5xx, an error event or a transport error.

Measured on the tiny demo model (2 shared CPU cores, ``--minutes 6``): the engine core 731 -> 982
MB (973 MB after the first minute, then +2.2 MB/min in steps of a few MB as padded oneDNN row
counts not yet seen appear); the API process 783 -> 797 MB (+0.05 MB/min), and +19 MB after the
10 MB prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench._server import cli, free_port, wait_healthy
from bench._soak_load import SHAPES, drive, large_prompt_body, send

MODEL_NAME = "soak"
MB = 1 << 20


@dataclass
class RssSeries:
    """RSS samples of one process: (seconds since the start, bytes)."""

    name: str
    process: psutil.Process | None
    samples: list[tuple[float, int]] = field(default_factory=list)

    def sample(self, elapsed: float) -> int | None:
        if self.process is None:
            return None
        rss = self.process.memory_info().rss
        self.samples.append((elapsed, rss))
        return rss


def slope_mb_per_min(samples: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of RSS over time, in MB per minute (None with fewer than 3 samples)."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in samples)
    if var_t == 0:
        return None
    cov = sum((t - mean_t) * (y - mean_y) for t, y in samples)
    return cov / var_t * 60 / MB


def core_process(server: psutil.Process) -> psutil.Process | None:
    """The engine-core child (spawned by multiprocessing), or None when the core is a thread."""
    cores = [c for c in server.children() if "spawn_main" in " ".join(c.cmdline())]
    return cores[0] if cores else None


async def soak(url: str, series: list[RssSeries], args: argparse.Namespace) -> Counter:
    outcomes: Counter = Counter()
    start = time.monotonic()
    load = asyncio.create_task(
        drive(url, MODEL_NAME, args.minutes * 60, args.concurrency, args.seed, outcomes)
    )
    while True:
        elapsed = time.monotonic() - start
        sizes = [s.sample(elapsed) for s in series]
        shown = "  ".join(
            f"{s.name} {size / MB:7.1f} MB"
            for s, size in zip(series, sizes, strict=True)
            if size is not None
        )
        print(f"  t={elapsed:5.0f}s  {shown}  requests {sum(outcomes.values())}", flush=True)
        if load.done():
            break
        await asyncio.wait({load}, timeout=args.interval)
    await load
    return outcomes


async def large_prompt(url: str, api: psutil.Process, megabytes: float) -> None:
    body = large_prompt_body(MODEL_NAME, megabytes)
    before = api.memory_info().rss
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        started = time.monotonic()
        response = await client.post("/v1/completions", json=body)
        seconds = time.monotonic() - started
        after = api.memory_info().rss  # before the server has released anything
        rng = random.Random(0)
        for shape in [SHAPES["completion"], SHAPES["chat"]] * 4:
            call = shape(rng)
            call.body["model"] = MODEL_NAME
            await send(client, call)
        await asyncio.sleep(2)  # what the server frees after a response may lag behind it
    settled = api.memory_info().rss
    print(
        f"large prompt ({megabytes:g} MB of text): HTTP {response.status_code} in {seconds:.1f} s; "
        f"API process RSS {before / MB:.0f} MB before, {after / MB:.0f} MB right after, "
        f"{settled / MB:.0f} MB after 8 more requests ({(settled - before) / MB:+.0f} MB)"
    )


def report(series: list[RssSeries], outcomes: Counter, warmup_s: float) -> None:
    print("outcomes:")
    for (kind, outcome), count in sorted(outcomes.items()):
        print(f"  {kind:30s} {outcome:>16s} {count:6d}")
    for s in series:
        if not s.samples:
            continue
        after_warmup = [(t, y) for t, y in s.samples if t >= warmup_s]
        slope = slope_mb_per_min(after_warmup)
        growth = (
            "n/a (too few samples after the warm-up)" if slope is None else f"{slope:+.2f} MB/min"
        )
        print(
            f"{s.name}: RSS {s.samples[0][1] / MB:.1f} MB at start, {s.samples[-1][1] / MB:.1f} MB "
            f"at the end (peak {max(y for _, y in s.samples) / MB:.1f} MB); after the "
            f"{warmup_s / 60:g}-minute warm-up: {growth} over {len(after_warmup)} samples"
        )


def bad_outcomes(outcomes: Counter) -> int:
    return sum(
        count
        for (_, outcome), count in outcomes.items()
        if outcome.startswith("5") or not (outcome.isdigit() or outcome == "cut")
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the soak")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="minutes left out of the growth slope"
    )
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--concurrency", type=int, default=6, help="clients sending at once")
    parser.add_argument(
        "--large-prompt-mb",
        type=float,
        default=10.0,
        help="size of the large prompt sent after the soak (0: none)",
    )
    parser.add_argument("--model", help="model directory (default: a generated tiny Llama)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a short dry run: 0.4 minutes, 2 s samples, a 1 MB prompt",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.minutes, args.warmup, args.interval, args.large_prompt_mb = 0.4, 0.1, 2.0, 1.0
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from infernetes.runtime.testing import make_tiny_llama

            model = str(make_tiny_llama(work / "model"))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = work / "server.log"
        with open(log_path, "wb") as log_file:
            server = subprocess.Popen(
                cli(
                    "serve",
                    model,
                    "--served-model-name",
                    MODEL_NAME,
                    "--max-model-len",
                    "512",
                    "--num-gpu-blocks-override",
                    "1024",
                    "--seed",
                    "0",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--disable-uvicorn-access-log",
                ),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
            )
            try:
                wait_healthy(url, server)
                api = psutil.Process(server.pid)
                series = [
                    RssSeries("API process", api),
                    RssSeries("engine core", core_process(api)),
                ]
                print(
                    f"soak: {args.minutes:g} min, {args.concurrency} clients, {len(SHAPES)} request "
                    f"shapes; RSS every {args.interval:g} s",
                    flush=True,
                )
                outcomes = asyncio.run(soak(url, series, args))
                report(series, outcomes, args.warmup * 60)
                if args.large_prompt_mb > 0:
                    asyncio.run(large_prompt(url, api, args.large_prompt_mb))
            except BaseException:
                print(log_path.read_text(errors="replace")[-3000:])
                raise
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(60)
    bad = bad_outcomes(outcomes)
    if bad:
        print(f"{bad} requests failed on the server's side (5xx, error events or transport errors)")
    return 1 if bad else 0
