"""An idle server waits for work without polling: with no request in flight its process tree (the
API process and the engine core's) uses next to no CPU, in either place the core runs. A resource
check, not a speed one: an idle replica on a shared node must not take its neighbours' cores."""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

IDLE_S = 5.0
# What an idle server may use in IDLE_S (1% of a core): its periodic checks (health, engine
# watch) cost about 0.01 CPU-s in 10 s; the core loop polling its input every 0.5 ms cost
# 0.06 CPU-s in 3 s, and a loop that spins costs a whole core.
MAX_IDLE_CPU_S = 0.05


def _tree_cpu_seconds(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        times = process.cpu_times()
        total += times.user + times.system
    return total


@pytest.mark.parametrize("multiprocessing", ["1", "0"], ids=["core-process", "core-thread"])
def test_idle_server_uses_almost_no_cpu(tiny_llama_dir, server_process_factory, multiprocessing):
    with server_process_factory(
        [str(tiny_llama_dir), "--disable-uvicorn-access-log"],
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing},
        log_name=f"idle-{multiprocessing}.log",
    ) as server:
        body = {"model": str(tiny_llama_dir), "prompt": "Hello", "max_tokens": 8}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).status_code == 200
        time.sleep(1.0)  # past OpenMP's spin after the last step
        before = _tree_cpu_seconds(server.process.pid)
        time.sleep(IDLE_S)
        used = _tree_cpu_seconds(server.process.pid) - before
    assert used < MAX_IDLE_CPU_S, f"the idle server used {used:.2f} CPU-s in {IDLE_S} s"
