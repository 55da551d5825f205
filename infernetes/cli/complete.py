"""``infernetes complete``: complete prompts with a running server (interactive, or one with -q)."""

from __future__ import annotations

import argparse

from infernetes.cli.chat import add_client_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "complete", help="Complete prompts through a running server's completions API."
    )
    add_client_args(parser)
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="tokens to generate per prompt"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infernetes.runtime.server.clients.interactive import complete, connect

    client, model = connect(args.url, args.api_key, args.model_name)
    print(f"Using model: {model}")
    complete(client, model, args.quick, args.max_tokens)
    return 0
