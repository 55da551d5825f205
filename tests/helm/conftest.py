"""The helm binary for the chart tests: the one cluster/build.sh builds at the pinned version
(cluster/versions.env), built on first use when it is missing (with the rest of the local
control plane's binaries, which `make e2e` needs anyway)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "infernetes"
BUILD = REPO_ROOT / "cluster" / "build.sh"


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    bin_dir = Path(
        subprocess.run(
            [str(BUILD), "--print"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    helm = bin_dir / "helm"
    if not helm.is_file():
        if shutil.which("go") is None and not Path("/usr/local/go/bin/go").is_file():
            pytest.skip(f"helm is not built ({helm}) and no Go toolchain is installed to build it")
        result = subprocess.run([str(BUILD)], capture_output=True, text=True)
        if result.returncode != 0 or not helm.is_file():
            pytest.fail(f"cluster/build.sh could not build helm:\n{result.stderr[-3000:]}")
    return helm
