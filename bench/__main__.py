"""``python -m bench [name ...]``: run the named benchmarks, or all of them."""

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if not m.name.startswith("_")
    )


def main(argv: list[str]) -> int:
    """Leading words name benchmarks (all when none); the rest is passed to each of them."""
    split = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:split] or available(), argv[split:]
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}",
            file=sys.stderr,
        )
        return 2
    status = 0
    for name in names:
        print(f"== bench {name} ==", flush=True)
        status |= importlib.import_module(f"bench.{name}").main(options)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
