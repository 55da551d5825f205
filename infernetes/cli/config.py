"""``infernetes config [serve arguments]``: print the resolved configuration as JSON, start nothing.

It runs what ``serve`` runs up to loading the weights: the parser and the support table (exit 2),
the settings checks ``serve`` makes before it starts anything (``runtime.preflight``, exit 2),
and, when the model is on local disk, the engine's own resolution against it
(``resolve_config``: context length, dtype, quantization, scheduler limits; exit 1 where the
engine would fail to start). So it exits as ``serve`` would, with the same message. A hub model
that is not in the local cache is not fetched, and a path that is not here may be the pod's:
their model-dependent values stay unresolved (a warning says so).
Secret values (``--api-key``, ``--hf-token``) print as ``***`` unless ``--show-secrets`` is
given. Deprecations and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infernetes.schema.args import CURRENT_ARGS
from infernetes.schema.config import ServeConfig
from infernetes.schema.model_info import find_config_json
from infernetes.schema.parser import parse_serve_args
from infernetes.schema.support_check import report_support

SHOW_SECRETS = "--show-secrets"
MASK = "***"
PROG = "infernetes config"


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
    config = parse_serve_args(argv, prog=PROG)
    report_support(config, PROG)
    from infernetes.runtime.preflight import check_settings

    try:
        check_settings(config)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if _on_local_disk(config):
        try:
            config = resolve_against_model(config)
        except ValueError as exc:  # what the engine fails to start on
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
    else:
        print(
            f"{PROG}: warning: {config.model} is not on local disk; the values that depend on "
            "the model (max_model_len, dtype, ...) are left to serve",
            file=sys.stderr,
        )
    print(json.dumps(render(config, show_secrets=SHOW_SECRETS in args.argv), indent=2))
    return 0


def _on_local_disk(config: ServeConfig) -> bool:
    """A path that exists here (whether or not it holds a model: serve's error is then ours), or
    a hub id whose config.json is in the local cache. A path that is not here may be the pod's
    (a volume's): its values are left to serve, as a hub model's are."""
    return Path(str(config.model)).expanduser().exists() or find_config_json(config) is not None


def resolve_against_model(config: ServeConfig) -> ServeConfig:
    """``config`` with the values the engine settles against the model, by the engine's own
    ``resolve_config`` (this imports torch); nothing is downloaded."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported
    from infernetes.runtime.engine.engine_config import resolve_config

    runtime, _ = resolve_config(config)
    return config.replace(
        max_model_len=runtime.model.max_model_len,
        dtype=str(runtime.model.info.dtype).removeprefix("torch."),
        quantization=runtime.model.quantization,
        block_size=runtime.cache.block_size,
        enable_prefix_caching=runtime.cache.enable_prefix_caching,
        max_num_seqs=runtime.scheduler.max_num_seqs,
        max_num_batched_tokens=runtime.scheduler.max_num_batched_tokens,
        enable_chunked_prefill=runtime.scheduler.enable_chunked_prefill,
        kv_events_config=None if runtime.kv_events is None else asdict(runtime.kv_events),
    )


def render(config: ServeConfig, *, show_secrets: bool = False) -> dict[str, dict[str, Any]]:
    grouped = config.grouped()
    if not show_secrets:
        for arg in CURRENT_ARGS:
            if arg.secret and grouped[arg.group][arg.dest] not in (None, False):
                grouped[arg.group][arg.dest] = MASK
    return grouped
