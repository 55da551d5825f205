"""``python bench/gpu/importable.py DIR``: the checkout importable as ``infernetes`` from DIR.

setup.py maps the top-level folders (runtime/, kernels/, ...) onto ``infernetes.*``; installing the
checkout needs a build backend the GPU image may lack offline, and a wheel built beforehand would
go stale with every edit. Instead DIR/infernetes holds links to the checkout's folders, following
setup.py's own mapping, so that PYTHONPATH=DIR runs the working tree as it is.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def folders() -> dict[str, str]:
    """setup.py's FOLDERS (package -> folder), read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FOLDERS":
            return ast.literal_eval(node.value)
    raise SystemExit("setup.py: no FOLDERS mapping found")


def link(target: Path) -> None:
    package = target / "infernetes"
    package.mkdir(parents=True, exist_ok=True)
    for name, folder in folders().items():
        if name == "infernetes":  # the top package: link each of its entries
            for entry in (ROOT / folder).iterdir():
                _replace(package / entry.name, entry)
        else:
            _replace(package / name.split(".", 1)[1], ROOT / folder)
    _replace(target / "bench", ROOT / "bench")  # for `python -m bench`


def _replace(path: Path, target: Path) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


if __name__ == "__main__":
    link(Path(sys.argv[1]))
