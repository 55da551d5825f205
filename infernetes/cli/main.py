"""``infernetes``: the console script.

Each subcommand is a module ``infernetes/cli/<name>.py`` with ``register(subparsers)``, which adds
its parser and sets ``func`` (called with the parsed namespace; its return value is the exit
code). A subcommand that parses its own arguments sets ``passthrough=True`` with ``set_defaults``
and finds them, unparsed, in ``args.argv``. Subcommand modules import only light modules at the
top, so ``--help`` never loads torch. A subcommand whose module does not exist yet is skipped.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from infernetes import __version__

SUBCOMMANDS = (
    "serve",
    "config",
    "collect-env",
    "chat",
    "complete",
    "run-batch",
    "bench",
    "operator",
    "download",
)


def _load(name: str):
    module_name = f"infernetes.cli.{name.replace('-', '_')}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infernetes",
        description="Serve large language models: a vLLM-compatible server and its Kubernetes operator.",
    )
    parser.add_argument("-v", "--version", action="version", version=f"infernetes {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(_available()) + "}")
    for name in SUBCOMMANDS:
        module = _load(name)
        if module is not None:
            module.register(subparsers)
    return parser


def _available() -> list[str]:
    return [name for name in SUBCOMMANDS if _load(name) is not None]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.argv = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
