"""The main of one worker process (``executor/multiproc_executor.py`` starts one per rank).

It reads its ``WorkerInit`` from the connection it was given, joins the process groups, builds
its ``Worker`` and says ready (or why not); then it answers calls ``(method, args)`` with
``(True, result)`` or ``(False, error)`` until told to stop or until the engine core goes away:
its connection closes, or, while a collective holds this process, its parent changes.

Run as ``python -m infernetes.runtime.worker.worker_process FD``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.logging_config import LoggingSettings, configure_logging

logger = logging.getLogger(__name__)

STOP = "shutdown"
PARENT_CHECK_S = 1.0


class WorkerInit(NamedTuple):
    config: RuntimeConfig
    rank: int
    init_method: str  # torch.distributed's rendezvous, e.g. tcp://127.0.0.1:PORT
    logging_settings: LoggingSettings


def _exit_when_orphaned(parent: int) -> None:
    """A worker stuck in a collective never reads its connection again: watch the parent."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="infernetes-parent-watch", daemon=True).start()


def _portable(error: BaseException) -> BaseException:
    from infernetes.runtime.engine.core_loop import portable_error

    return portable_error(error)


def serve(conn: Connection, init: WorkerInit) -> None:
    from infernetes.runtime.model_executor import parallel
    from infernetes.runtime.worker.worker import Worker

    config, rank = init.config, init.rank
    backend = "nccl" if config.device.device.type == "cuda" else "gloo"
    try:
        parallel.init_distributed(
            rank,
            config.parallel.tensor_parallel_size,
            config.parallel.pipeline_parallel_size,
            init.init_method,
            backend,
            config.parallel.layer_partition,
            config.parallel.expert_parallel,
        )
        worker = Worker(config, rank)
    except BaseException as error:
        logger.exception("rank %d failed to load", rank)
        conn.send_bytes(pickle.dumps((False, _portable(error))))
        return
    conn.send_bytes(pickle.dumps((True, None)))
    while True:
        method, args = pickle.loads(conn.recv_bytes())
        if method == STOP:
            break
        try:
            reply: tuple[bool, Any] = (True, getattr(worker, method)(*args))
        except Exception as error:
            logger.exception("rank %d: %s failed", rank, method)
            reply = (False, _portable(error))
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
    parallel.destroy_distributed()


def main(fd: int) -> None:
    # The API process owns the signals (it drains on SIGTERM, then stops the engine and us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_when_orphaned(os.getppid())
    conn = Connection(fd)
    init: WorkerInit = pickle.loads(conn.recv_bytes())
    configure_logging(init.logging_settings, tag=f"rank {init.rank} pid {os.getpid()}")
    with contextlib.suppress(EOFError, OSError):  # the engine core is gone; so are we
        serve(conn, init)


if __name__ == "__main__":
    main(int(sys.argv[1]))
