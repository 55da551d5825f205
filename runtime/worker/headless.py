"""A ``--headless`` node of a multi-node run (``--nnodes N --node-rank R``, R > 0).

No API server and no engine core: node R's ranks connect to node 0 (``executor/node_link.py``),
each hands its accepted connection to a worker process of its own, and node 0's executor calls
them as it calls its local ones. The node lives as long as its workers: when node 0 stops them
it exits 0; when node 0 goes away (a connection closes) or a worker dies it exits 1, so a
LeaderWorkerSet recreates the group.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.engine_config import resolve_config
from infernetes.runtime.executor.node_link import NodeLinkError, connect_to_leader, rendezvous_url
from infernetes.runtime.logging_config import LoggingSettings, configure_logging
from infernetes.runtime.worker.worker_process import WorkerInit, spawn

from infernetes.schema.config import ServeConfig

logger = logging.getLogger(__name__)

POLL_S = 0.5


def _start_workers(config: RuntimeConfig) -> list[subprocess.Popen[bytes]]:
    """Join node 0 with every local rank, then start their processes (node 0's seed first:
    every rank must draw the same samples)."""
    links = [connect_to_leader(config, rank) for rank in config.parallel.local_ranks]
    seed = links[0][1]
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, seed=seed))
    logging_settings = LoggingSettings.from_env()
    processes = []
    for rank, (sock, _) in zip(config.parallel.local_ranks, links, strict=True):
        with sock:
            init = WorkerInit(config, rank, rendezvous_url(config.parallel), logging_settings)
            processes.append(spawn(init, sock))
    return processes


def _wait(processes: list[subprocess.Popen[bytes]]) -> int:
    """0 once every worker was stopped by node 0; 1 as soon as one exits otherwise."""
    while True:
        codes = [process.poll() for process in processes]
        failed = [(p, c) for p, c in zip(processes, codes, strict=True) if c not in (None, 0)]
        if failed:
            process, code = failed[0]
            logger.error(
                "A worker (pid %d) exited with code %d: node 0 went away or the rank failed; "
                "stopping this node",
                process.pid,
                code,
            )
            return 1
        if all(code == 0 for code in codes):
            logger.info("Node 0 stopped this node's workers")
            return 0
        time.sleep(POLL_S)


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_headless(serve_config: ServeConfig) -> int:
    """Serve node ``--node-rank``'s ranks until node 0 stops them or goes away."""
    configure_logging(LoggingSettings.from_env(), tag=f"node {serve_config.node_rank}")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _raise_exit)
    try:
        config, _ = resolve_config(serve_config)
    except ValueError as error:
        print(f"infernetes serve: error: {error}", file=sys.stderr)
        return 2
    parallel = config.parallel
    logger.info(
        "Headless node %d of %d: ranks %d..%d, node 0 at %s:%d",
        parallel.node_rank,
        parallel.nnodes,
        parallel.local_ranks.start,
        parallel.local_ranks.stop - 1,
        parallel.master_addr,
        parallel.master_port,
    )
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes = _start_workers(config)
        return _wait(processes)
    except NodeLinkError as error:
        logger.error("%s", error)
        return 1
    finally:
        for process in processes:  # they ignore SIGTERM: their signals are their parent's
            if process.poll() is None:
                process.kill()
            process.wait()
        logger.info("Headless node %d (pid %d) stopped", parallel.node_rank, os.getpid())
