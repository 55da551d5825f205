"""``infernetes config [serve arguments]``: print the resolved configuration as JSON, start nothing.

Every group, defaults filled in, model-dependent values resolved when the model's config.json is
on local disk (the dtype by the rule the engine applies, on the device it would run on). Secret values (``--api-key``, ``--hf-token``) print as ``***`` unless
``--show-secrets`` is given. Deprecations go to stderr; bad input exits 2 naming the argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from infernetes.schema.args import CURRENT_ARGS
from infernetes.schema.config import ServeConfig
from infernetes.schema.model_info import find_config_json, resolve_model_defaults
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
        host = engine_host(config.device) if find_config_json(config) else None
        config = resolve_model_defaults(config, host=host)
    except ValueError as exc:  # ConfigError, or a device that is not there
        print(f"infernetes config: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(render(config, show_secrets=SHOW_SECRETS in args.argv), indent=2))
    return 0


def engine_host(device: str | None) -> tuple[str, bool]:
    """The device type the engine would run on and whether that CPU computes bf16 natively, by
    the engine's own probes (this imports torch), so the dtype printed is the one served."""
    from infernetes.runtime.engine.engine_config import resolve_device
    from infernetes.runtime.model_executor.loader import cpu_has_fast_bf16

    device_type = resolve_device(device).type
    return device_type, device_type == "cpu" and cpu_has_fast_bf16()


def render(config: ServeConfig, *, show_secrets: bool = False) -> dict[str, dict[str, Any]]:
    grouped = config.grouped()
    if not show_secrets:
        for arg in CURRENT_ARGS:
            if arg.secret and grouped[arg.group][arg.dest] not in (None, False):
                grouped[arg.group][arg.dest] = MASK
    return grouped
