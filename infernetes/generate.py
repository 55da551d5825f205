"""``make generate``: rewrite every generated file that is checked in.

``GENERATORS`` maps a path (relative to the repository root) to ``"module:function"``; the
function takes no arguments and returns the file's text. Add a generated file with one line here.
``python -m infernetes.generate --check`` exits 1 and names the stale files instead of writing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

GENERATORS: dict[str, str] = {
    "docs/reference/serve-arguments.md": "infernetes.schema.reference:render_args_markdown",
    "docs/reference/environment-variables.md": "infernetes.schema.reference:render_env_markdown",
    "docs/reference/models.md": "infernetes.runtime.model_executor.models.catalog:render_models_markdown",
    "crds/inferenceservices.infernetes.io.yaml": "infernetes.operator.crd:crd_yaml",
    "crds/kopf-peerings.kopf.dev.yaml": "infernetes.operator.generated:peering_yaml",
    "helm/infernetes/crds/inferenceservices.infernetes.io.yaml": "infernetes.operator.crd:crd_yaml",
    "helm/infernetes/crds/kopf-peerings.kopf.dev.yaml": "infernetes.operator.generated:peering_yaml",
    "helm/infernetes/values.schema.json": "infernetes.operator.chart_schema:values_schema_json",
}

REPO_ROOT = Path(__file__).resolve().parent.parent


def render(target: str) -> str:
    module_name, _, function = GENERATORS[target].partition(":")
    return getattr(importlib.import_module(module_name), function)()


def stale(root: Path = REPO_ROOT) -> list[str]:
    """The generated files whose checked-in text differs from what the generators produce now."""
    out = []
    for target in GENERATORS:
        path = root / target
        if not path.is_file() or path.read_text(encoding="utf-8") != render(target):
            out.append(target)
    return out


def write_all(root: Path = REPO_ROOT) -> list[str]:
    """Writes every generated file; returns the ones that changed."""
    changed = []
    for target in GENERATORS:
        path = root / target
        text = render(target)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(target)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infernetes.generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="Only report stale files (exit 1 if any)."
    )
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale()
        for target in outdated:
            print(f"stale: {target} (run `make generate`)", file=sys.stderr)
        return 1 if outdated else 0
    for target in write_all():
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
