"""``make lint``'s type check: mypy over the four source folders, named as they install.

setup.py maps ``runtime/`` onto ``infernetes.runtime`` (and ``operator/``, ``kernels/`` likewise).
mypy names a module by its folder, so ``mypy runtime`` checks a ``runtime.server`` that nothing
imports and cannot resolve one ``infernetes.runtime`` import; and it cannot see through the
editable install's import hook, so ``mypy -p infernetes`` finds no ``infernetes.runtime`` either.
This asks the installed package where each part lives, names every file by the module it is
imported as, and hands mypy that list: every file is checked once, each import resolves to the
source file, and errors are reported at the real paths. The options come from pyproject.toml's
``[tool.mypy]``; arguments are passed on to mypy (``python -m infernetes.typecheck --strict``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mypy import build, util
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

# The parts setup.py maps onto the one namespace (its FOLDERS); each is found where it is installed.
PACKAGES = ("infernetes", "infernetes.runtime", "infernetes.operator", "infernetes.kernels")


def package_folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"typecheck: {package} is not installed (run make setup)")
    return Path(next(iter(spec.submodule_search_locations)))


def module_sources() -> list[BuildSource]:
    """Every .py file of the parts as ``BuildSource(path, module name)``."""
    sources = []
    for package in PACKAGES:
        folder = package_folder(package)
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = ".".join((package, *parts))
            sources.append(BuildSource(os.path.relpath(path), module))
    return sources


def main(argv: Sequence[str] = ()) -> int:
    fscache = FileSystemCache()
    # mypy's own argument handling reads [tool.mypy]; the one source it needs is replaced.
    _, options = process_options([*argv, "-c", "pass"], fscache=fscache)
    sources = module_sources()
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    messages: list[str] = []

    def flush_errors(filename: str | None, new: list[str], serious: bool) -> None:
        messages.extend(new)
        out = sys.stderr if serious else sys.stdout
        for line in new:
            print(formatter.colorize(line) if options.color_output else line, file=out)

    blockers = False
    try:
        # An extra library path that holds nothing: mypy's way of not searching the current
        # directory, whose operator/ would shadow the standard library's operator module.
        build.build(sources, options, os.devnull, flush_errors, fscache, sys.stdout, sys.stderr)
    except CompileError:  # its messages went through flush_errors
        blockers = True
    n_errors, _, n_files = util.count_stats(messages)
    color = options.color_output
    if n_errors:
        print(
            formatter.format_error(
                n_errors, n_files, len(sources), blockers=blockers, use_color=color
            )
        )
    else:
        print(formatter.format_success(len(sources), use_color=color))
    return 2 if blockers else 1 if n_errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
