"""``infernetes config [serve arguments]``: print the resolved configuration as JSON, start nothing.

Every group, defaults filled in, model-dependent values resolved when the model's config.json is
on local disk. Secret values (``--api-key``, ``--hf-token``) print as ``***`` unless
``--show-secrets`` is given. Deprecations go to stderr; bad input exits 2 naming the argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from infernetes.schema.args import CURRENT_ARGS
from infernetes.schema.config import ConfigError, ServeConfig
from infernetes.schema.model_info import resolve_model_defaults
from infernetes.schema.parser import parse_serve_args
from infernetes.schema.support_check import report_support

SHOW_SECRETS = "--show-secrets"
MASK = "***"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="Check serve arguments: print the resolved configuration as JSON, grouped.",
        add_help=False,
        prefix_chars="\0",  # every token goes to the schema parser
    )
    parser.set_defaults(func=run, passthrough=True)


def run(args: argparse.Namespace) -> int:
    argv = [a for a in args.argv if a != SHOW_SECRETS]
    config = parse_serve_args(argv, prog="infernetes config")
    report_support(config, "infernetes config")
    try:
        config = resolve_model_defaults(config)
    except ConfigError as exc:
        print(f"infernetes config: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(render(config, show_secrets=SHOW_SECRETS in args.argv), indent=2))
    return 0


def render(config: ServeConfig, *, show_secrets: bool = False) -> dict[str, dict[str, Any]]:
    grouped = config.grouped()
    if not show_secrets:
        for arg in CURRENT_ARGS:
            if arg.secret and grouped[arg.group][arg.dest] not in (None, False):
                grouped[arg.group][arg.dest] = MASK
    return grouped
