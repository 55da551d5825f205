"""``infernetes download MODEL``: fetch a model's files into the Hugging Face cache, as serve would.

The operator's model-cache Job runs it (spec.modelCache.download) so the server's pods find the
model in the cache: the same files `serve` fetches (runtime.model_executor.loader's patterns),
the token from HF_TOKEN, the cache from HF_HOME or --download-dir.
"""

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "download", help="Download a model from the Hugging Face hub into the cache, as serve does."
    )
    parser.add_argument("model", help="A Hugging Face model id (org/name).")
    parser.add_argument("--revision", default=None, help="Branch, tag or commit.")
    parser.add_argument("--download-dir", default=None, help="Cache folder (default: HF_HOME's).")
    parser.add_argument(
        "--ignore-patterns",
        nargs="*",
        default=None,
        help="Files not to download (default: serve's, original/**/*).",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infernetes.runtime.model_executor.loader import (
        DEFAULT_IGNORE_PATTERNS,
        ModelLoadError,
        resolve_model_path,
    )

    ignore = DEFAULT_IGNORE_PATTERNS if args.ignore_patterns is None else args.ignore_patterns
    try:
        path = resolve_model_path(
            args.model, args.revision, args.download_dir, ignore_patterns=ignore
        )
    except ModelLoadError as error:
        print(f"infernetes download: {error}")
        return 1
    print(path)
    return 0
