"""A Llama-3.1-8B-shaped server (`--load-format dummy`, bf16) on one NVIDIA GPU: start-up, then
load at two concurrencies.

    python -m bench gpu_serve [--json PATH]
    python -m bench gpu_serve --smoke     # the same on a tiny shape, on the CPU (a dry run)

1. start: seconds from ``infernetes serve`` to the first ``/health`` 200, twice: the first start
   fills the caches (Triton's kernels, the graph captures' compilations), the second finds them
   warm (issue 33's target: under 30 s warm).
2. load: ``infernetes bench serve`` on random token-id prompts, input and output lengths uniform
   in 100-1024 (EOS ignored): 256 requests at concurrency 256 (output tokens/s), and 128 at
   concurrency 32 (ITL p50, TTFT p99). The checkpoint's tokenizer is one word per id of the
   whole vocabulary (``t0``, ``t1``, ...): whatever ids the dummy weights pick, each streamed token
   detokenizes to text, which is what the client times.

Without a GPU (and without --smoke) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench._gpu import add_json_option, write_json
from bench._llama8b.model import write_model_dir
from bench._server import cli, free_port, random_dataset, wait_healthy

# U(100, 1024): a centre of 562 tokens and a ratio of 462/562 either side.
CENTRE, RATIO = 562, 462 / 562
LOADS = {
    "concurrency-256": (256, 256),
    "concurrency-32": (32, 128),
}  # name: (concurrency, requests)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench gpu_serve", description=__doc__)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # the tiny shape's context
        args.max_model_len = 256
    return args


def _write_tokenizer(model_dir: Path) -> None:
    """A word-level tokenizer with one word per id of the model's vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    config = json.loads((model_dir / "config.json").read_text())
    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = config["eos_token_id"]
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=f"t{config['bos_token_id']}",
        eos_token=f"t{eos[0] if isinstance(eos, list) else eos}",
    ).save_pretrained(model_dir)


def _serve(model_dir: Path, args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = cli(
        "serve",
        str(model_dir),
        *("--load-format", "dummy"),
        *("--max-model-len", str(args.max_model_len), "--port", str(port)),
        *("--dtype", "float32" if args.smoke else "bfloat16"),
    )
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _start_seconds(model_dir: Path, args: argparse.Namespace, log: Path) -> float:
    start = time.monotonic()
    process, url = _serve(model_dir, args, log)
    try:
        wait_healthy(url, process, timeout=400)
        return time.monotonic() - start
    finally:
        _stop(process)


def _load(url: str, concurrency: int, requests: int, result: Path, args) -> dict:
    centre = 16 if args.smoke else CENTRE
    requests = min(requests, 8) if args.smoke else requests
    command = cli(
        "bench",
        "serve",
        *("--base-url", url, "--max-concurrency", str(concurrency)),
        *random_dataset(requests, centre, centre),
        *("--random-range-ratio", str(RATIO), "--percentile-metrics", "ttft,tpot,itl"),
        *("--metric-percentiles", "50,99", "--save-result", "--result-filename", str(result)),
    )
    subprocess.run(command, check=True, stdout=sys.stderr)
    return json.loads(result.read_text())


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_serve: no CUDA device here; skipped (run on an NVIDIA GPU, or --smoke)")
        return 0
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)"
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp) / "llama-3.1-8b-shape", args.smoke)
        log = Path(tmp) / "server.log"
        _write_tokenizer(model_dir)
        try:
            results["start_cold_s"] = _start_seconds(model_dir, args, log)
            results["start_warm_s"] = _start_seconds(model_dir, args, log)
            process, url = _serve(model_dir, args, log)
            try:
                wait_healthy(url, process, timeout=400)
                for name, (concurrency, requests) in LOADS.items():
                    result = Path(tmp) / f"{name}.json"
                    results[name] = _load(url, concurrency, requests, result, args)
            finally:
                _stop(process)
        except Exception:
            print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
    print(f"device: {device_name}")
    print(
        f"start to /health: {results['start_cold_s']:.1f} s cold, {results['start_warm_s']:.1f} s warm"
    )
    for name in LOADS:
        figures = results[name]
        print(
            f"{name}: {figures.get('output_throughput', 0):.0f} output tok/s, "
            f"ITL p50 {figures.get('p50_itl_ms', float('nan')):.2f} ms, "
            f"TTFT p99 {figures.get('p99_ttft_ms', float('nan')):.0f} ms"
        )
    write_json(args.json, "gpu_serve", device_name, argv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
