"""However the server ends — SIGTERM or SIGINT while the model loads, SIGKILL, a model that fails to
load — it leaves no process behind: the engine-core child (and anything it started) goes too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_port

# Deadlines for things that must happen eventually; never asserted as timings.
WAIT_S = 120


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (by the parent ids in /proc), zombies left out."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in parents.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {WAIT_S} s for {what}")
        time.sleep(0.2)


def start(model: Path, log: Path) -> subprocess.Popen:
    port = free_port()
    command = [sys.executable, "-m", "infernetes.cli.main", "serve", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--disable-log-stats"]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_loading_ends_the_server_and_its_engine_core(sig, tiny_llama_dir, tmp_path):
    log = tmp_path / "server.log"
    server = start(tiny_llama_dir, log)
    try:
        wait_until(lambda: children_of(server.pid), "the engine-core process")
        children = children_of(server.pid)
        server.send_signal(sig)
        code = server.wait(WAIT_S)
    finally:
        if server.poll() is None:
            server.kill()
    assert code in (0, 1), log.read_text()[-2000:]
    wait_until(lambda: not any(alive(pid) for pid in children), "the children to exit")


def test_a_killed_server_takes_its_engine_core_with_it(tiny_llama_dir, tmp_path):
    log = tmp_path / "server.log"
    server = start(tiny_llama_dir, log)
    try:
        wait_until(lambda: children_of(server.pid), "the engine-core process")
        children = children_of(server.pid)
        server.kill()  # no handler runs: the children must notice by themselves
        server.wait(WAIT_S)
    finally:
        if server.poll() is None:
            server.kill()
    wait_until(lambda: not any(alive(pid) for pid in children), "the orphaned children to exit")
    # It stopped at once rather than loading on (it shares the log) and failing only at the end.
    assert "KV cache size" not in log.read_text()


def test_a_model_that_fails_to_load_is_exit_1_with_no_child_left(tiny_llama_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in tiny_llama_dir.iterdir():
        if item.is_file():
            os.symlink(item, broken / item.name)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
        weights.write_bytes(b"not a safetensors file")
    log = tmp_path / "server.log"
    server = start(broken, log)
    children: set[int] = set()
    try:
        deadline = time.monotonic() + WAIT_S
        while server.poll() is None and time.monotonic() < deadline:
            children |= children_of(server.pid)
            time.sleep(0.1)
        code = server.wait(WAIT_S)
    finally:
        if server.poll() is None:
            server.kill()
    assert code == 1, log.read_text()[-2000:]
    assert "failed to load" in log.read_text()
    wait_until(lambda: not any(alive(pid) for pid in children), "the children to exit")
