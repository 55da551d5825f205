"""``infernetes run-batch -i in.jsonl -o out.jsonl --model M``: run an OpenAI batch file through
the engine in-process. Any ``serve`` argument is accepted; ``--port``/``--url`` place the
Prometheus endpoint of ``--enable-metrics``."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run-batch",
        help="Run an OpenAI batch file (JSONL) through the engine (serve args accepted).",
    )
    parser.add_argument(
        "-i", "--input-file", required=True, help="batch file: a local path or an http(s) URL"
    )
    parser.add_argument(
        "-o",
        "--output-file",
        required=True,
        help="results file: a local path, or an http(s) URL to upload to with PUT",
    )
    parser.add_argument(
        "--output-tmp-dir", default=None, help="stage the output here before moving/uploading"
    )
    parser.add_argument(
        "--enable-metrics", action="store_true", help="serve Prometheus metrics while running"
    )
    parser.add_argument("--url", default="0.0.0.0", help="address of the metrics endpoint")
    parser.add_argument("--port", type=int, default=8000, help="port of the metrics endpoint")
    parser.set_defaults(func=run, passthrough=True)


def run(args: argparse.Namespace) -> int:
    from infernetes.schema.parser import parse_serve_args

    config = parse_serve_args(args.argv, prog="infernetes run-batch")
    import asyncio

    from infernetes.runtime.server.clients.batch import run_batch

    metrics = (args.url, args.port) if args.enable_metrics else None
    failed = asyncio.run(
        run_batch(config, args.input_file, args.output_file, args.output_tmp_dir, metrics)
    )
    if failed:
        print(
            f"infernetes run-batch: {failed} request(s) failed; see their errors in {args.output_file}",
            file=sys.stderr,
        )
    return 0
