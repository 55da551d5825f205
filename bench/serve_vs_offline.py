"""Serving overhead: ``infernetes bench serve`` at concurrency 64 against a running server, versus
``infernetes bench throughput`` (the engine alone, no HTTP) on the same model, prompts and engine
arguments, in the same run. Prints both output-token throughputs and their ratio (target >= 0.85).

The default model has the shape of ``bench/engine_throughput.py``'s (Llama, 8 layers, hidden 512,
vocabulary 32000): the forward pass costs what a small real model's does, so the ratio measures
the HTTP layer against real work. ``--shape toy`` picks a 4-layer, hidden-256 Llama instead, where
per-token HTTP/SSE cost dominates the compute (a worst case for the ratio).

Both sides cap the batch at the concurrency (``--max-num-seqs``), so the ratio measures what the
HTTP layer costs, not a wider offline batch, and both run with the same intra-op thread count
(``--threads``, OMP_NUM_THREADS): the server's engine core runs in a process of its own (or a
worker thread) and the offline one in the main thread, and on a loaded machine OpenMP's spinning
threads make the two behave very differently unless the count is pinned. Each side runs ``--rounds`` times, alternating, and
the best round of each counts: other load on a shared machine only ever slows a round down.
Each served round also reports the server's CPU seconds per output token, split between the
engine (the engine-core process; or the busiest thread with VLLM_ENABLE_V1_MULTIPROCESSING=0)
and the HTTP side (the API server process; or every other thread): a measure of what HTTP costs
that other load on the machine skews far less than the throughput ratio does.

    python -m bench serve_vs_offline [--model DIR | --shape engine|toy] [--num-prompts 128]
                                     [--concurrency 64] ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from bench._server import cli, free_port, random_dataset, wait_healthy

TARGET_RATIO = 0.85


# Llama shapes (transformers config fields) selectable by --shape.
SHAPES = {
    # bench/engine_throughput.py's default model.
    "engine": {
        "hidden_size": 512,
        "intermediate_size": 512 * 11 // 4,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
    },
    # Tiny: per-token HTTP/SSE work outweighs the forward pass.
    "toy": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}


def describe_shape(name: str) -> str:
    shape = SHAPES[name]
    return (
        f"generated Llama '{name}': {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
        f"vocab {shape.get('vocab_size', 'tokenizer')}"
    )


def _make_model(directory: Path, shape: str) -> Path:
    from infernetes.runtime.testing import make_tiny_model

    return make_tiny_model(directory, "LlamaForCausalLM", **SHAPES[shape])


def offline_round(
    engine_args: list[str], dataset: list[str], out: Path, env: dict[str, str]
) -> float:
    subprocess.run(
        cli("bench", "throughput", *dataset, "--output-json", str(out), *engine_args),
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    return json.loads(out.read_text())["output_throughput"]


def _thread_cpu(pid: int) -> dict[tuple[int, int], float]:
    """CPU seconds (user + system) of each thread of process ``pid`` and of its children (the
    engine-core process), keyed by (process id, thread id)."""
    import psutil

    server = psutil.Process(pid)
    return {
        (process.pid, t.id): t.user_time + t.system_time
        for process in [server, *server.children(recursive=True)]
        for t in process.threads()
    }


def http_side_share(
    before: dict[tuple[int, int], float], after: dict[tuple[int, int], float], server_pid: int
) -> tuple[float, float]:
    """(engine CPU seconds, HTTP-side CPU seconds) between two snapshots. With an engine-core
    process, the engine is that process and the HTTP side the server process; with the core in a
    thread, the engine is the busiest thread and the HTTP side every other one."""
    used = {key: after[key] - before.get(key, 0.0) for key in after}
    if any(process != server_pid for process, _ in used):
        engine = sum(v for (process, _), v in used.items() if process != server_pid)
        return engine, sum(v for (process, _), v in used.items() if process == server_pid)
    ordered = sorted(used.values(), reverse=True)
    return (ordered[0] if ordered else 0.0), sum(ordered[1:])


def serve_round(
    engine_args: list[str],
    dataset: list[str],
    concurrency: int,
    out: Path,
    log: Path,
    env: dict[str, str],
) -> tuple[float, float, float]:
    """Served output tokens/s, and the server's engine and HTTP-side CPU seconds per
    output token (a measure of the HTTP cost that other load on the machine does not skew)."""
    port = free_port()
    with open(log, "ab") as log_file:
        server = subprocess.Popen(
            cli(
                "serve",
                *engine_args,
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
            wait_healthy(f"http://127.0.0.1:{port}", server)
            before = _thread_cpu(server.pid)
            subprocess.run(
                cli(
                    "bench",
                    "serve",
                    "--port",
                    str(port),
                    *dataset,
                    "--max-concurrency",
                    str(concurrency),
                    "--result-filename",
                    str(out),
                ),
                check=True,
                stdout=subprocess.DEVNULL,
                env=env,
            )
            engine_cpu, http_cpu = http_side_share(before, _thread_cpu(server.pid), server.pid)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    result = json.loads(out.read_text())
    if result["failed"]:
        raise RuntimeError(f"{result['failed']} requests failed: {result['errors']}")
    tokens = max(result["total_output_tokens"], 1)
    return result["output_throughput"], engine_cpu / tokens, http_cpu / tokens


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench serve_vs_offline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", help="model directory (default: a generated Llama of --shape)")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="engine",
        help="shape of the generated model: engine (engine_throughput's, the "
        "default) or toy (4 layers, hidden 256)",
    )
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on both sides")
    args = parser.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}

    with tempfile.TemporaryDirectory(prefix="serve-vs-offline-") as tmp:
        work = Path(tmp)
        model = args.model or str(_make_model(work / "model", args.shape))
        engine_args = [
            model,
            "--max-num-seqs",
            str(args.concurrency),
            "--seed",
            "0",
            "--max-model-len",
            str(2 * (args.input_len + args.output_len)),
        ]
        dataset = random_dataset(args.num_prompts, args.input_len, args.output_len)
        offline, served, engine_cpu, http_cpu = [], [], [], []
        for round_index in range(args.rounds):
            offline.append(
                offline_round(engine_args, dataset, work / f"offline-{round_index}.json", env)
            )
            rate, engine_per_token, http_per_token = serve_round(
                engine_args,
                dataset,
                args.concurrency,
                work / f"serve-{round_index}.json",
                work / "server.log",
                env,
            )
            served.append(rate)
            engine_cpu.append(engine_per_token)
            http_cpu.append(http_per_token)
            print(
                f"round {round_index + 1}: offline {offline[-1]:.1f} tok/s, served {rate:.1f} tok/s "
                f"(server CPU per output token: engine {engine_per_token * 1e6:.0f} us, "
                f"HTTP side {http_per_token * 1e6:.0f} us)",
                flush=True,
            )
    ratio = max(served) / max(offline)
    print(
        f"model: {args.model or describe_shape(args.shape)}; {args.num_prompts} prompts, "
        f"input {args.input_len}, output {args.output_len} tokens; concurrency {args.concurrency}; "
        f"cpu count {os.cpu_count()}; OMP_NUM_THREADS={args.threads}"
    )
    print(f"offline engine:  {max(offline):8.1f} output tokens/s (best of {args.rounds})")
    print(f"served over HTTP:{max(served):8.1f} output tokens/s (best of {args.rounds})")
    print(f"ratio served/offline: {ratio:.3f} (target >= {TARGET_RATIO})")
    http_share = min(h / (e + h) for e, h in zip(engine_cpu, http_cpu, strict=True) if e + h)
    print(
        f"HTTP side's share of the server's CPU: {http_share:.1%} (least of {args.rounds}); "
        f"{min(http_cpu) * 1e6:.0f} us per output token"
    )
    return 0
