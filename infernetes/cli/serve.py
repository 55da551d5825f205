"""``infernetes serve``: parse the vLLM-style command line and start the OpenAI-compatible server
(or, with ``--headless``, only this node's ranks of a multi-node run)."""

from __future__ import annotations

import argparse

from infernetes.schema.parser import parse_serve_args
from infernetes.schema.support_check import report_support


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="Start the OpenAI-compatible API server (vllm serve's arguments).",
        add_help=False,
        prefix_chars="\0",  # every token, --help included, goes to the schema parser
    )
    parser.set_defaults(func=run, passthrough=True)


def run(args: argparse.Namespace) -> int:
    config = parse_serve_args(args.argv, prog="infernetes serve")
    report_support(config, "infernetes serve")  # exits 2 on a refused setting, before torch loads
    if config.headless:  # a node after the first of --nnodes: its ranks, no API server
        from infernetes.runtime.worker.headless import run_headless

        return run_headless(config)
    from infernetes.runtime.server.api_server import run_server  # heavy: torch, fastapi

    run_server(config)
    return 0
