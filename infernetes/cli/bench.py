"""``infernetes bench serve|throughput|latency``: load a running server, or time the engine alone.

``serve`` drives a server over HTTP (request rate and/or max concurrency, random or ShareGPT
prompts) and reports throughput and TTFT/TPOT/ITL/E2E percentiles. ``throughput`` and
``latency`` load the model in-process; any ``serve`` argument (``--max-num-seqs``, ...) is
accepted after the bench options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _dataset_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset-name", choices=("random", "sharegpt"), default="random")
    parser.add_argument(
        "--dataset-path", help="ShareGPT-format JSON file (--dataset-name sharegpt)"
    )
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--random-input-len", type=int, default=32)
    parser.add_argument("--random-output-len", type=int, default=32)
    parser.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths vary uniformly within len*[1-ratio, 1+ratio]",
    )
    parser.add_argument(
        "--sharegpt-output-len",
        type=int,
        default=None,
        help="fixed output length instead of the dataset's reply lengths",
    )
    parser.add_argument("--seed", type=int, default=0)


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "bench", help="Benchmark a server (serve) or the engine (throughput, latency)."
    )
    kinds = bench.add_subparsers(
        dest="bench_command", metavar="{serve,throughput,latency}", required=True
    )

    serve = kinds.add_parser("serve", help="Load a running OpenAI-compatible server.")
    serve.add_argument(
        "--base-url", help="server URL, e.g. http://localhost:8000 (else --host/--port)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--endpoint", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions")
    )
    serve.add_argument("--model", help="model name to request; the server's first by default")
    serve.add_argument("--tokenizer", help="tokenizer for the prompts; the model's path by default")
    serve.add_argument(
        "--api-key", default=os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    )
    serve.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests per second (Poisson arrivals); inf sends all at once",
    )
    serve.add_argument("--max-concurrency", type=int, default=None)
    serve.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS instead of generating exactly their output length",
    )
    serve.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    serve.add_argument("--metric-percentiles", default="50,90,99")
    serve.add_argument("--save-result", action="store_true")
    serve.add_argument("--result-filename", default=None)
    _dataset_args(serve)
    serve.set_defaults(func=run_serve)

    throughput = kinds.add_parser(
        "throughput", help="Offline throughput of the engine (serve args accepted)."
    )
    _dataset_args(throughput)
    throughput.add_argument("--output-json", default=None)
    throughput.set_defaults(func=run_throughput, passthrough=True)

    latency = kinds.add_parser(
        "latency", help="Latency of one batch through the engine (serve args accepted)."
    )
    latency.add_argument("--input-len", type=int, default=32)
    latency.add_argument("--output-len", type=int, default=128)
    latency.add_argument("--batch-size", type=int, default=8)
    latency.add_argument("--num-iters-warmup", type=int, default=2)
    latency.add_argument("--num-iters", type=int, default=5)
    latency.add_argument("--seed", type=int, default=0)
    latency.add_argument("--output-json", default=None)
    latency.set_defaults(func=run_latency, passthrough=True)


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"infernetes bench: error: {flag} must be comma-separated numbers, got {text!r}"
        ) from None


def make_requests(args: argparse.Namespace, tokenizer: Any) -> list[Any]:
    from infernetes.runtime.server.benchmarks.datasets import random_requests, sharegpt_requests

    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise SystemExit(
                "infernetes bench: error: --dataset-name sharegpt needs --dataset-path"
            )
        return sharegpt_requests(
            args.dataset_path, args.num_prompts, tokenizer, args.seed, args.sharegpt_output_len
        )
    return random_requests(
        args.num_prompts,
        args.random_input_len,
        args.random_output_len,
        args.random_range_ratio,
        len(tokenizer),
        args.seed,
        set(getattr(tokenizer, "all_special_ids", [])),
    )


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def run_serve(args: argparse.Namespace) -> int:
    import asyncio

    import httpx

    from infernetes.runtime.server.benchmarks.serve_client import (
        format_report,
        run_benchmark,
        summarize,
    )

    base_url = args.base_url or f"http://{args.host}:{args.port}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    models = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"]
    model = args.model or models[0]["id"]
    tokenizer_path = args.tokenizer or next(
        (m.get("root") for m in models if m["id"] == model), model
    )
    requests = make_requests(args, _load_tokenizer(tokenizer_path))
    percentiles = _floats(args.metric_percentiles, "--metric-percentiles")
    metrics = [m for m in args.percentile_metrics.split(",") if m]
    results, duration = asyncio.run(
        run_benchmark(
            base_url,
            args.endpoint,
            model,
            requests,
            request_rate=args.request_rate,
            max_concurrency=args.max_concurrency,
            ignore_eos=args.ignore_eos,
            api_key=args.api_key,
            seed=args.seed,
        )
    )
    summary = summarize(results, duration, percentiles)
    print(format_report(summary, percentiles, metrics))
    if summary["errors"]:
        print("errors:", *summary["errors"], sep="\n  ", file=sys.stderr)
    if args.save_result or args.result_filename:
        path = args.result_filename or f"bench-serve-{model.replace('/', '_')}.json"
        with open(path, "w") as handle:
            json.dump(
                {
                    "model": model,
                    "max_concurrency": args.max_concurrency,
                    "request_rate": args.request_rate,
                    **summary,
                },
                handle,
                indent=2,
            )
    return 0 if summary["failed"] == 0 else 1


def _engine_config(args: argparse.Namespace) -> Any:
    from infernetes.schema.parser import parse_serve_args

    argv = list(args.argv)
    if "--seed" not in argv:
        argv += ["--seed", str(args.seed)]
    return parse_serve_args(argv, prog=f"infernetes bench {args.bench_command}")


def run_throughput(args: argparse.Namespace) -> int:
    from infernetes.runtime.server.benchmarks.offline import load_engine, throughput

    engine = load_engine(_engine_config(args))
    result = throughput(engine, make_requests(args, engine.tokenizer))
    print(
        f"Throughput: {result['request_throughput']:.2f} requests/s, "
        f"{result['total_token_throughput']:.2f} total tokens/s, "
        f"{result['output_throughput']:.2f} output tokens/s"
    )
    if args.output_json:
        with open(args.output_json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


def run_latency(args: argparse.Namespace) -> int:
    from infernetes.runtime.server.benchmarks.datasets import random_requests
    from infernetes.runtime.server.benchmarks.offline import latency, load_engine

    engine = load_engine(_engine_config(args))
    batch = random_requests(
        args.batch_size,
        args.input_len,
        args.output_len,
        0.0,
        len(engine.tokenizer),
        args.seed,
        set(engine.tokenizer.all_special_ids),
    )
    result = latency(engine, batch, args.num_iters_warmup, args.num_iters)
    print(f"Avg latency: {result['avg_latency_s']:.4f} seconds")
    for p in (10, 25, 50, 75, 90, 99):
        print(f"{p}% percentile latency: {result[f'p{p}_latency_s']:.4f} seconds")
    if args.output_json:
        with open(args.output_json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0
