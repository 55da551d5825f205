"""``infernetes config [serve arguments]``: print the resolved configuration as JSON, start nothing.

Deprecations go to stderr; bad input exits 2 with a message naming the argument.
"""

from __future__ import annotations

import argparse
import json
import sys

from infernetes.schema.config import ConfigError
from infernetes.schema.model_info import resolve_model_defaults
from infernetes.schema.parser import parse_serve_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="Check serve arguments: print the resolved configuration as JSON, grouped.",
        add_help=False,
        prefix_chars="\0",
    )
    parser.set_defaults(func=run, passthrough=True)


def run(args: argparse.Namespace) -> int:
    config = parse_serve_args(args.argv, prog="infernetes config")
    try:
        config = resolve_model_defaults(config)
    except ConfigError as exc:
        print(f"infernetes config: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(config.grouped(), indent=2, sort_keys=False))
    return 0
