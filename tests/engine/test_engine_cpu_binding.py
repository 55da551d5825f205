"""VLLM_CPU_OMP_THREADS_BIND: which CPUs each CPU rank's threads run on, as vLLM's CPU backend
reads the variable, and an engine that runs its model there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from infernetes.runtime.engine.engine_config import _cpu_threads_bind
from infernetes.runtime.worker.cpu_binding import (
    check_bind,
    parse_cpu_list,
    quota_cpus,
    rank_cpus,
    usable_cpus,
)


def test_cpu_lists_read_as_the_kernel_writes_them():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    for bad in ("", "a-b", "3-1", "0-", "1,,2"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpu_list(bad)


def test_each_rank_takes_its_own_list_and_keywords_pick_the_allowed_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    assert rank_cpus(None, 0, 1) is None
    assert rank_cpus("nobind", 0, 1) is None
    assert rank_cpus("all", 1, 2) == allowed
    assert rank_cpus("0-1|2-3,6", 0, 2) == [0, 1]
    assert rank_cpus("0-1|2-3,6", 1, 2) == [2, 3, 6]
    with pytest.raises(ValueError, match="names 2 CPU list"):
        rank_cpus("0|1", 2, 3)
    # auto: every rank gets CPUs it may use, and ranks that share a node do not overlap
    first, second = rank_cpus("auto", 0, 2), rank_cpus("auto", 1, 2)
    assert first and second and set(first) <= set(allowed) and set(second) <= set(allowed)
    if len(allowed) >= 2:
        assert not set(first) & set(second)


def test_a_malformed_bind_is_refused_when_the_config_is_resolved():
    check_bind("auto")
    check_bind("0-3|4-7")
    with pytest.raises(ValueError, match="VLLM_CPU_OMP_THREADS_BIND: not a CPU list"):
        _cpu_threads_bind({"VLLM_CPU_OMP_THREADS_BIND": "0-3|x"})
    assert _cpu_threads_bind({}) is None


_ENGINE_ON_BOUND_CPUS = """
import json, os, sys, threading, torch
from infernetes.runtime.llm import LLM
llm = LLM(sys.argv[1], dtype="float32", max_model_len=64, num_gpu_blocks_override=16)
tokens = llm.generate([[1, 2, 3]])[0].outputs[0].token_ids
print(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
                  "tokens": len(tokens)}))
"""


def test_the_engine_runs_its_model_on_the_bound_cpus(tiny_llama):
    last = max(os.sched_getaffinity(0))
    result = subprocess.run(
        [sys.executable, "-c", _ENGINE_ON_BOUND_CPUS, str(tiny_llama)],
        env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(last)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # the one-rank engine runs in this process's thread: it and its intra-op pool use one CPU
    assert report == {"cpus": [last], "threads": 1, "tokens": report["tokens"]}
    assert report["tokens"] > 0


def test_a_cpu_quota_caps_the_cpus_a_rank_uses(tmp_path):
    """A pod's ``limits.cpu`` (cgroup v2 ``cpu.max``, v1's CFS files) caps the threads: 1.5 CPUs
    are 2, no quota leaves the CPUs the process may run on."""
    allowed = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert quota_cpus(v2) == 2
    assert usable_cpus(v2) == min(allowed, 2)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert quota_cpus(v2) is None and usable_cpus(v2) == allowed
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert quota_cpus(v1) == 1 and usable_cpus(v1) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert quota_cpus(v1) is None
    assert quota_cpus(tmp_path / "none") is None
