"""How long ``infernetes serve --help`` and friends take to start, against a bare interpreter.

Each command runs several times in a fresh process; the median wall time is reported, with its
ratio to ``python -c pass`` (the baseline measured in the same run) and to ``import torch`` (what
a careless top-level import would cost). The budget for ``serve --help`` is 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

BUDGET_S = 1.0


def commands() -> dict[str, list[str]]:
    py = sys.executable
    cli = [py, "-m", "infernetes.cli.main"]
    return {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "infernetes --help": [*cli, "--help"],
        "infernetes serve --help": [*cli, "serve", "--help"],
        "infernetes serve --help=CacheConfig": [*cli, "serve", "--help=CacheConfig"],
        "infernetes config org/model -tp 2": [*cli, "config", "org/model", "-tp", "2"],
        "python -c 'import torch' (reference)": [py, "-c", "import torch"],
    }


def time_command(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench cli_startup", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="Runs per command (median is reported)."
    )
    args = parser.parse_args(argv)
    results = {label: time_command(cmd, args.runs) for label, cmd in commands().items()}
    baseline = results["python -c pass (baseline)"]
    print(f"{'command':42} {'median s':>9} {'x baseline':>11}")
    for label, seconds in results.items():
        print(f"{label:42} {seconds:9.3f} {seconds / baseline:11.1f}")
    serve_help = results["infernetes serve --help"]
    verdict = "within" if serve_help < BUDGET_S else "OVER"
    print(
        f"serve --help: {serve_help:.3f} s, {verdict} the {BUDGET_S:.0f} s budget "
        f"({serve_help / results[next(k for k in results if 'torch' in k)]:.2f} x import torch)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
