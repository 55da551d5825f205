"""Where a CPU rank's intra-op threads run: ``VLLM_CPU_OMP_THREADS_BIND`` as vLLM's CPU backend
reads it. Unset or ``nobind``: torch's own placement stays, with as many threads as the CPUs the
process may use and its CPU quota allow (``usable_cpus``; OMP_NUM_THREADS decides when set);
``all``: every CPU this process may use; ``auto``: the CPUs of NUMA node ``index % nodes``, split
evenly among the ranks that share a node; a list such as ``0-3,8|4-7,9``: rank ``index`` takes
entry ``index``.

The worker binds the thread that runs the model before it starts any OpenMP work, so the thread
pool that torch creates from it inherits the CPUs, and runs one intra-op thread per CPU."""

from __future__ import annotations

import math
import os
from pathlib import Path

KEYWORDS = ("auto", "all", "nobind")
_NODES = Path("/sys/devices/system/node")
_CGROUP = Path("/sys/fs/cgroup")


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. 0-31 or 0,2,4)")
        start, end = int(first), int(last or first)
        if end < start:
            raise ValueError(f"not a CPU list: {text!r} ({part} runs backwards)")
        cpus.extend(range(start, end + 1))
    return cpus


def check_bind(bind: str | None) -> None:
    """Raise ValueError when ``bind`` is neither a keyword nor ``|``-separated CPU lists."""
    if bind and bind not in KEYWORDS:
        for entry in bind.split("|"):
            parse_cpu_list(entry)


def _numa_nodes() -> list[list[int]]:
    nodes = sorted(_NODES.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    return [parse_cpu_list(text) for p in nodes if (text := (p / "cpulist").read_text().strip())]


def rank_cpus(bind: str | None, index: int, ranks: int) -> list[int] | None:
    """The CPUs of the ``index``-th of ``ranks`` CPU ranks on this host, or None to leave its
    threads where they are."""
    if not bind or bind == "nobind":
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if bind == "all":
        return allowed
    if bind == "auto":
        nodes = [[c for c in node if c in allowed] for node in _numa_nodes()]
        nodes = [node for node in nodes if node] or [allowed]
        node = nodes[index % len(nodes)]
        per_node = -(-ranks // len(nodes))  # the ranks that share a node
        share = max(1, len(node) // per_node)
        position = index // len(nodes)
        return node[position * share : (position + 1) * share] or node
    entries = bind.split("|")
    if index >= len(entries):
        raise ValueError(
            f"VLLM_CPU_OMP_THREADS_BIND={bind!r} names {len(entries)} CPU list(s); "
            f"rank {index} of this host needs one"
        )
    return parse_cpu_list(entries[index])


def quota_cpus(cgroup: Path = _CGROUP) -> int | None:
    """The CPUs this container's CFS quota buys (a pod's ``limits.cpu``, ``docker --cpus``),
    rounded up; None without a quota. cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us``."""
    try:
        quota, _, period = (cgroup / "cpu.max").read_text().partition(" ")
    except OSError:
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text()
        except OSError:
            return None
    quota, period = quota.strip(), period.strip()
    # "max" (v2) and -1 (v1) mean no quota
    if not quota.isdigit() or not period.isdigit() or not int(period):
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def usable_cpus(cgroup: Path = _CGROUP) -> int:
    """How many CPUs this process can keep busy: those it may run on, capped by its quota."""
    allowed = len(os.sched_getaffinity(0))
    quota = quota_cpus(cgroup)
    return min(allowed, quota) if quota else allowed


def bind_threads(cpus: list[int]) -> None:
    """Run this thread, the threads it starts and torch's intra-op pool on ``cpus``."""
    import torch

    os.sched_setaffinity(0, cpus)  # Linux: the calling thread; new threads inherit it
    torch.set_num_threads(len(cpus))
