"""`make cluster` / `make cluster-down`: the command line starts a control plane of its own, and
`down` ends exactly the processes it started and removes the state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from localcluster import CLUSTER_DIR, ClusterError, LocalCluster, process_alive

SCRIPT = CLUSTER_DIR / "localcluster.py"


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_up_status_down_by_pid(cluster: LocalCluster, tmp_path: Path) -> None:
    state_dir = tmp_path / "dev-cluster"
    up = _cli(state_dir, "up", "--nodes", "1")
    assert up.returncode == 0, up.stderr
    assert "control plane ready" in up.stdout
    processes = json.loads((state_dir / "state.json").read_text())["processes"]
    try:
        assert all(process_alive(p["pid"], p["exe"]) for p in processes.values())
        assert _cli(state_dir, "status").returncode == 0
        assert _cli(state_dir, "up").stdout.startswith("already running")

        own = LocalCluster(state_dir)
        assert own.nodes == ["kwok-gpu-0"]
        assert own.kubectl_json("get", "nodes")["items"][0]["metadata"]["name"] == "kwok-gpu-0"
        # A separate control plane: the session's cluster does not see this one's nodes.
        assert own.server != cluster.server
    finally:
        down = _cli(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert not any(process_alive(p["pid"], p["exe"]) for p in processes.values())
    assert not state_dir.exists()
    assert _cli(state_dir, "status").returncode == 1
    # The session's cluster is untouched.
    assert cluster.running()


def test_bad_input_is_named(cluster: LocalCluster, tmp_path: Path) -> None:
    result = _cli(tmp_path / "x", "up", "--nodes", "0")
    assert result.returncode == 2
    assert "--nodes" in result.stderr

    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    with pytest.raises(ClusterError, match=r"missing binaries.*kube-apiserver"):
        LocalCluster(tmp_path / "y", empty_bin).start()


def test_a_component_that_dies_fails_the_start_with_its_log(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    broken_bin = tmp_path / "bin"
    broken_bin.mkdir()
    for binary in cluster.bin_dir.iterdir():
        (broken_bin / binary.name).symlink_to(binary)
    (broken_bin / "kube-apiserver").unlink()
    (broken_bin / "kube-apiserver").write_text(
        "#!/bin/sh\necho 'flag provided but not defined'\nexit 3\n"
    )
    (broken_bin / "kube-apiserver").chmod(0o755)
    broken = LocalCluster(tmp_path / "state", broken_bin)

    with pytest.raises(ClusterError) as error:
        broken.start(timeout=60)

    assert "kube-apiserver exited with code 3" in str(error.value)
    assert "flag provided but not defined" in str(error.value)  # the component's log
    assert (tmp_path / "state" / "logs" / "kube-apiserver.log").exists()
    assert not (tmp_path / "state" / "state.json").exists()  # etcd was stopped again
