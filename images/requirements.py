"""Prints the requirements of the infernetes distribution and the given extras, one a line.

The Containerfile installs these in a layer of their own before it copies the source, so that
changing the code does not download PyTorch again. pyproject.toml stays the only place that
names them. Standard library only (it runs on the base image's bare Python).

    python3 requirements.py [pyproject.toml] [extra ...]
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"requirements.py: unknown extra {unknown}; allowed: {sorted(optional)}")
    out = list(project.get("dependencies", []))
    for extra in extras:
        out += [item for item in optional[extra] if item not in out]
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv and argv[0].endswith(".toml") else Path("pyproject.toml")
    extras = argv[1:] if argv and argv[0].endswith(".toml") else argv
    print("\n".join(requirements(path, extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
