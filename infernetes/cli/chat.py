"""``infernetes chat``: chat with a running server (interactive, or one message with -q)."""

from __future__ import annotations

import argparse
import os

DEFAULT_URL = "http://localhost:8000/v1"


def add_client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"the server's API base URL (default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--model-name", default=None, help="model to use; the server's first by default"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        help="API key (default: VLLM_API_KEY or OPENAI_API_KEY)",
    )
    parser.add_argument(
        "-q",
        "--quick",
        metavar="MESSAGE",
        default=None,
        help="send one message, print the reply and exit",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat", help="Chat with a running server through its chat completions API."
    )
    add_client_args(parser)
    parser.add_argument(
        "--system-prompt", default=None, help="a system message to start the conversation"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infernetes.runtime.server.clients.interactive import chat, connect

    client, model = connect(args.url, args.api_key, args.model_name)
    print(f"Using model: {model}")
    chat(client, model, args.system_prompt, args.quick)
    return 0
