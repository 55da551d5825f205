"""The executor of one worker process per rank (``--distributed-executor-backend mp``).

Each local rank is a ``python -m infernetes.runtime.worker.worker_process`` child of the engine
core's process with one end of a socket pair (``multiprocessing.connection`` framing, pickled
calls). With ``--nnodes N`` this is node 0: it runs the first ``world / N`` ranks so, and the
other nodes' ranks (``--headless``, ``worker/headless.py``) connect to it over TCP
(``node_link.py``) and are called over those sockets the same way. A call is pickled once and
sent to every rank; the replies are gathered as they come, so a rank that fails, dies or
disconnects is seen at once even while the others wait in a collective for it. Calls may be sent
before the earlier ones are answered (the steps of a pipeline, ``submit_model``): each rank
answers in order, so replies are read oldest call first. Workers are plain subprocesses, not
``multiprocessing`` children: the engine core's own process is daemonic, and a daemonic process
may not start ``multiprocessing`` children.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import subprocess
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.executor.abstract import (
    RanksApartExecutor,
    WorkerDiedError,
    with_shared_seed,
)
from infernetes.runtime.executor.node_link import JoinedRank, RankListener, rendezvous_url
from infernetes.runtime.logging_config import LoggingSettings
from infernetes.runtime.worker.worker_process import STOP, WorkerInit, spawn

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


class WorkerProcess:
    """One local rank's process and the connection to it."""

    def __init__(self, init: WorkerInit) -> None:
        self.rank = init.rank
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = spawn(init, theirs)
        self.conn = Connection(ours.detach())

    def exited(self) -> bool:
        return self.process.poll() is not None

    def died(self) -> WorkerDiedError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(1.0)
        return WorkerDiedError(
            f"worker rank {self.rank} (pid {self.process.pid}) exited "
            f"(exit code {self.process.returncode})"
        )

    def stop(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.conn.send_bytes(pickle.dumps((STOP, ())))
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()


class RemoteRank:
    """A rank of another node, reached over the TCP connection it opened to this one."""

    def __init__(self, joined: JoinedRank) -> None:
        self.rank = joined.rank
        self.node = joined.node
        self.peer = joined.peer
        self.conn = joined.conn

    def exited(self) -> bool:
        """Between calls nothing is due from a rank: a readable connection is a closed one."""
        try:
            return self.conn.poll(0)
        except OSError:
            return True

    def died(self) -> WorkerDiedError:
        return WorkerDiedError(
            f"worker rank {self.rank} on node {self.node} ({self.peer}) disconnected"
        )

    def stop(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.conn.send_bytes(pickle.dumps((STOP, ())))
            self.conn.poll(timeout)  # until it hangs up
        self.conn.close()


Rank = WorkerProcess | RemoteRank


class PendingCall:
    """A call sent to every rank whose replies have not been read yet."""

    def __init__(self, executor: MultiprocExecutor, pick: int | None = None) -> None:
        self.executor = executor
        self.pick = pick  # the rank whose reply is the result; None: every rank's, in order
        self.replies: list[Any] | None = None

    def result(self) -> Any:
        while self.replies is None:
            self.executor._read_oldest()
        return self.replies if self.pick is None else self.replies[self.pick]


def _stop_workers(workers: list[Rank]) -> None:
    for worker in workers:
        worker.stop(STOP_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MultiprocExecutor(RanksApartExecutor):
    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__(config)
        parallel = config.parallel
        world_size = parallel.world_size
        needed = parallel.local_world_size * parallel.data_parallel_size
        if config.device.device.type == "cuda" and torch.cuda.device_count() < needed:
            raise ValueError(
                f"data_parallel_size x tensor_parallel_size x pipeline_parallel_size / nnodes is "
                f"{needed}, but {torch.cuda.device_count()} CUDA device(s) are visible "
                "(CUDA_VISIBLE_DEVICES)"
            )
        config = with_shared_seed(config)
        listener = None
        if parallel.nnodes > 1:
            listener = RankListener(config, config.model.seed or 0)
            init_method = rendezvous_url(parallel)
        else:
            init_method = f"tcp://127.0.0.1:{_free_port()}"
        logging_settings = LoggingSettings.from_env()
        self.workers: list[Rank] = [
            WorkerProcess(WorkerInit(config, rank, init_method, logging_settings))
            for rank in parallel.local_ranks
        ]
        # Stopped with the executor, or at interpreter exit at the latest.
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers)
        self._unanswered: deque[PendingCall] = deque()
        try:
            if listener is not None:
                joined = listener.join(alive=self.check_health)
                self.workers.extend(RemoteRank(rank) for rank in joined)
            self._gather()  # each rank says ready once its shard is loaded
        except BaseException:
            self.shutdown()
            raise
        logger.info("Started %d worker ranks (%s)", world_size, _layout(config))
        for report in self.collective_rpc("report"):
            logger.info(
                "Rank %(rank)d on %(device)s: %(attention_layers)d layers of %(attention_heads)d "
                "attention and %(kv_heads)d KV heads; %(checkpoint_bytes_read)d checkpoint bytes read",
                report,
            )

    def _send(self, method: str, args: tuple[Any, ...], pick: int | None = None) -> PendingCall:
        call = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        for worker in self.workers:
            try:
                worker.conn.send_bytes(call)
            except OSError:
                raise worker.died() from None
        pending = PendingCall(self, pick)
        self._unanswered.append(pending)
        return pending

    def _read_oldest(self) -> None:
        # Taken off first: a failed call is not read again (the engine stops on it anyway).
        pending = self._unanswered.popleft()
        pending.replies = self._gather()

    def _gather(self) -> list[Any]:
        """Every rank's reply, in rank order; the first failure or death raises."""
        pending = {worker.conn: worker for worker in self.workers}
        results: dict[int, Any] = {}
        while pending:
            for conn in wait(list(pending)):
                worker = pending.pop(conn)  # type: ignore[call-overload]  # wait returns what it was given
                try:
                    ok, value = pickle.loads(worker.conn.recv_bytes())
                except (EOFError, OSError):
                    raise worker.died() from None
                if not ok:
                    raise value
                results[worker.rank] = value
        return [results[worker.rank] for worker in self.workers]

    def check_health(self) -> None:
        for worker in self.workers:
            # With steps in flight a remote rank's connection is readable for its replies: its
            # death shows when they are read.
            if isinstance(worker, RemoteRank) and self._unanswered:
                continue
            if worker.exited():
                raise worker.died()

    def shutdown(self) -> None:
        self._finalizer()


def _layout(config: RuntimeConfig) -> str:
    parallel = config.parallel
    nodes = f", over {parallel.nnodes} nodes" if parallel.nnodes > 1 else ""
    return (
        f"tensor parallel {parallel.tensor_parallel_size}, "
        f"pipeline parallel {parallel.pipeline_parallel_size}, on {config.device.device.type}"
        f"{nodes}"
    )
