"""What ``--distributed-executor-backend`` needs installed, checked before anything starts (the
API process runs it too, so it imports nothing heavy)."""

from __future__ import annotations

import importlib.util


def check_executor_backend(backend: str | None) -> None:
    """ValueError when ``backend`` cannot run in this installation."""
    if backend == "ray" and not _installed("ray"):
        raise ValueError(
            "--distributed-executor-backend ray needs Ray, which is not installed here: "
            "pip install 'infernetes[ray]', or use mp (the default above one rank)"
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it; a module without a spec
        return False
