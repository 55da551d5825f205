"""Tensor and pipeline parallelism on the CPU: TP 2 and PP 2 against TP 1, and what a parallel
step costs on top.

A Llama-shaped model with random weights (default: 8 layers, hidden 512, vocabulary 32000) is
written to a temporary folder; the same prompts (random token ids, greedy, EOS ignored) run
through ``LLM(..., tensor_parallel_size=1)``, ``tensor_parallel_size=2`` and
``pipeline_parallel_size=2`` (one worker process per rank, gloo), the last twice: with the engine's
batch queue (two steps in flight, one per stage) and with one step at a time; then TP 2 again
with ``--distributed-executor-backend ray`` (one Ray actor per rank; skipped without Ray).
Printed:

- output tokens/s of each and the ratios to TP 1. Each rank computes with ``--threads`` torch
  threads (default 1, as in ``engine_throughput``: on a small shared CPU a second OpenMP thread
  waits in barriers whenever its core is busy), so on 2 cores TP 2 and PP 2 use both and TP 1 one:
  the ratio is what splitting the model over two cores buys once the collectives are paid. PP 2
  one step at a time leaves a stage idle while the other computes; the batch queue keeps both
  busy, each on half of the running requests, which gains where a stage's time grows with its
  tokens (prefill-heavy: ``--input-len 200-400 --output-len 8-16 --num-prompts 64``) and not in
  small-batch CPU decode, whose step costs the same for half the requests (weights read once);
- the executor's round trip: a call broadcast to both workers and both replies gathered
  (``collective_rpc``), median over 200 calls, as a share of TP 2's mean step time, for the
  worker processes and for the Ray actors;
- one all-reduce of a decode step's activations (``[max-num-seqs, hidden]`` float32) in a
  two-process gloo group, median over 200, times the ``2 * layers`` the model runs per step, as a
  share of the same step time.

Run: ``python -m bench parallel`` (``--help`` for sizes).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from unittest import mock

from bench.engine_throughput import make_requests, write_llama

# (name, tensor parallel, pipeline parallel, steps in flight: None for the engine's own,
#  executor backend: None for the default)
RUNS = [
    ("TP 1", 1, 1, None, None),
    ("TP 2", 2, 1, None, None),
    ("PP 2, one step at a time", 1, 2, 1, None),
    ("PP 2", 1, 2, None, None),
    ("TP 2, Ray actors", 2, 1, None, "ray"),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench parallel", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument(
        "--input-len", type=lambda t: tuple(map(int, t.split("-"))), default=(32, 128)
    )
    parser.add_argument(
        "--output-len", type=lambda t: tuple(map(int, t.split("-"))), default=(64, 128)
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    return parser.parse_args(argv)


def run(
    path: str, requests, args: argparse.Namespace, tp: int, pp: int = 1, backend: str | None = None
) -> tuple[float, int, object]:
    """Seconds for all requests, engine steps taken, and the LLM (kept for the round trip)."""
    from infernetes import LLM, SamplingParams

    steps = 0

    class StepCounter:
        def record(self, scheduler_stats, iteration_stats) -> None:
            nonlocal steps
            steps += 1

    llm = LLM(
        path,
        dtype="float32",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        distributed_executor_backend=backend,
        max_model_len=512,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=1 << 30,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
        seed=args.seed,
    )
    llm.llm_engine.engine_core.stat_loggers.append(StepCounter())
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        for _, n in requests
    ]
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, detokenize=False))  # warm-up
    steps = 0
    start = time.perf_counter()
    llm.generate([p for p, _ in requests], params)
    return time.perf_counter() - start, steps, llm


def round_trip_s(llm, calls: int = 200) -> float:
    executor = llm.llm_engine.engine_core.executor
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        executor.collective_rpc("kv_cache_block_bytes")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _all_reduce_rank(rank: int, port: int, rows: int, hidden: int, calls: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.randn(rows, hidden)
    times = []
    for _ in range(calls):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def all_reduce_s(rows: int, hidden: int, calls: int = 200) -> float:
    import multiprocessing

    from infernetes.runtime.executor.multiproc_executor import _free_port

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = _free_port()
    ranks = [
        context.Process(target=_all_reduce_rank, args=(r, port, rows, hidden, calls, out))
        for r in range(2)
    ]
    for process in ranks:
        process.start()
    result = out.get(timeout=300)
    for process in ranks:
        process.join()
    return result


def main(argv: list[str]) -> int:
    import torch
    from infernetes.runtime.executor.multiproc_executor import MultiprocExecutor

    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # TP 1's rank runs in this process
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers' (read at their start)
    requests = make_requests(args)
    output_tokens = sum(n for _, n in requests)
    with tempfile.TemporaryDirectory(prefix="infernetes-bench-") as folder:
        path = write_llama(folder, args.layers, args.hidden, args.vocab)
        print(
            f"model: Llama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, float32; "
            f"{len(requests)} prompts, {output_tokens} output tokens; {os.cpu_count()} cores",
            flush=True,
        )
        results, trips = {}, {}
        for name, tp, pp, in_flight, backend in RUNS:
            if backend == "ray" and importlib.util.find_spec("ray") is None:
                print(f"{name:26s} skipped: Ray is not installed", flush=True)
                continue
            with mock.patch.object(MultiprocExecutor, "max_concurrent_batches", in_flight or pp):
                elapsed, steps, llm = run(path, requests, args, tp, pp, backend)
            results[name] = (elapsed, steps)
            print(
                f"{name:26s} {elapsed:7.2f} s  {output_tokens / elapsed:8.1f} output tok/s  "
                f"{steps} steps, {1e3 * elapsed / steps:6.2f} ms a step",
                flush=True,
            )
            if tp == 2:
                trips[name] = round_trip_s(llm)
            llm.llm_engine.shutdown()
            del llm
    step_s = results["TP 2"][0] / results["TP 2"][1]
    reduce_s = all_reduce_s(args.max_num_seqs, args.hidden) * 2 * args.layers
    for name in list(results)[1:]:
        print(f"ratio {name} / TP 1 throughput: {results['TP 1'][0] / results[name][0]:.2f}x")
    for name, trip in trips.items():
        print(
            f"executor round trip (broadcast + gather), {name}: {1e6 * trip:7.1f} us "
            f"= {trip / step_s:.1%} of a TP 2 step"
        )
    print(
        f"all-reduces of a decode step ({2 * args.layers} x [{args.max_num_seqs}, {args.hidden}]): "
        f"{1e6 * reduce_s:7.1f} us = {reduce_s / step_s:.1%} of a TP 2 step"
    )
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
