"""The main of one worker process (``executor/multiproc_executor.py`` starts one per local rank,
``worker/headless.py`` one per rank of a ``--headless`` node).

It reads its ``WorkerInit`` from stdin, joins the process groups, builds its ``Worker`` and says
ready (or why not) on the connection it was given (a socket pair to the engine core, or a TCP
socket to node 0's); then it answers calls ``(method, args)`` with ``(True, result)`` or
``(False, error)`` until told to stop (exit 0) or until the engine core goes away (exit 1): its
connection closes, or, while a collective holds this process, the peer hangs up or its parent
changes.

Run as ``python -m infernetes.runtime.worker.worker_process FD`` (``spawn`` does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
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


def spawn(init: WorkerInit, conn: socket.socket) -> subprocess.Popen[bytes]:
    """Start rank ``init.rank``'s process serving ``conn`` (the caller closes its own copy)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "infernetes.runtime.worker.worker_process", str(conn.fileno())],
        pass_fds=(conn.fileno(),),
        stdin=subprocess.PIPE,
    )
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError), process.stdin:  # a dead child is seen by its conn
        process.stdin.write(pickle.dumps(init, protocol=pickle.HIGHEST_PROTOCOL))
    return process


def _exit_when_abandoned(parent: int, fd: int, stopping: threading.Event) -> None:
    """A worker stuck in a collective never reads its connection again: watch the parent and the
    peer's end of the connection (node 0 on another host may vanish while its parent lives)."""

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    def watch_peer() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLRDHUP)  # hang-ups only, never the calls themselves
        poller.poll()
        os._exit(0 if stopping.is_set() else 1)

    for target in (watch_parent, watch_peer):
        threading.Thread(target=target, name=f"infernetes-{target.__name__}", daemon=True).start()


def _portable(error: BaseException) -> BaseException:
    from infernetes.runtime.engine.core_loop import portable_error

    return portable_error(error)


def serve(conn: Connection, init: WorkerInit, stopping: threading.Event) -> None:
    from infernetes.runtime.model_executor import parallel
    from infernetes.runtime.worker.worker import start_rank

    try:
        worker = start_rank(init.config, init.rank, init.init_method)
    except BaseException as error:
        logger.exception("rank %d failed to load", init.rank)
        conn.send_bytes(pickle.dumps((False, _portable(error))))
        return
    conn.send_bytes(pickle.dumps((True, None)))
    while True:
        method, args = pickle.loads(conn.recv_bytes())
        if method == STOP:
            stopping.set()
            break
        try:
            reply: tuple[bool, Any] = (True, getattr(worker, method)(*args))
        except Exception as error:
            logger.exception("rank %d: %s failed", init.rank, method)
            reply = (False, _portable(error))
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
    parallel.destroy_distributed()


def main(fd: int) -> None:
    # The API process owns the signals (it drains on SIGTERM, then stops the engine and us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stopping = threading.Event()
    _exit_when_abandoned(os.getppid(), fd, stopping)
    init: WorkerInit = pickle.loads(sys.stdin.buffer.read())
    configure_logging(init.logging_settings, tag=f"rank {init.rank} pid {os.getpid()}")
    try:
        serve(Connection(fd), init, stopping)
    except (EOFError, OSError):  # the engine core is gone; so are we
        sys.exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]))
