"""The local control plane a cluster benchmark runs on (cluster/localcluster.py)."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "cluster"))

from localcluster import (  # noqa: E402  (cluster/, put on the path above)
    DEFAULT_STATE_DIR,
    LocalCluster,
    build_binaries,
    cached_bin_dir,
)


@contextlib.contextmanager
def local_cluster() -> Iterator[LocalCluster]:
    """A running `make cluster` built from the pinned versions, else a private one."""
    shared = LocalCluster(DEFAULT_STATE_DIR)
    if shared.running() and shared.bin_dir == cached_bin_dir():
        yield shared
        return
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as state:
        private = LocalCluster(Path(state), build_binaries())
        private.start()
        try:
            yield private
        finally:
            private.stop()
