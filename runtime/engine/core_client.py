"""Where the engine core runs, seen from the API side: ``CoreProcess`` (its own process, vLLM V1's
layout: the API process keeps HTTP, tokenization and SSE, the core process schedules and runs the
model, and the two use separate cores and separate GILs) or ``CoreThread`` (a thread of this
process; ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

Both take commands with ``send(command)`` and hand every message of the core to ``on_message``
(called from one thread of theirs, never the event loop's); both kinds are ``messages``' types.
The process variant pickles both ways over one duplex pipe; a reader thread turns the core's
messages into ``on_message`` calls and reports the process's death (the pipe closes) as an
``EngineDead`` message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from infernetes.runtime.engine.core_loop import CoreLoop, StatsBuffer, portable_error
from infernetes.runtime.engine.messages import (
    AddRequest,
    EngineCommand,
    EngineDead,
    EngineInfo,
    EngineMessage,
    EngineReady,
    LoadFailed,
    Shutdown,
    StepOutputs,
    from_wire,
    to_wire,
)
from infernetes.runtime.logging_config import LoggingSettings, configure_logging
from infernetes.runtime.outputs import (
    CompletionOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)

from infernetes.schema.config import ServeConfig

if TYPE_CHECKING:  # the API process never imports the engine itself (torch)
    from infernetes.runtime.engine.engine_core import EngineCore

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 3600.0  # loading a big model from a slow disk takes a while
JOIN_TIMEOUT_S = 10.0


class CoreThread:
    """The engine core in a thread of this process."""

    def __init__(
        self,
        config: ServeConfig,
        on_message: Callable[[EngineMessage], None],
        data_parallel_rank: int = 0,
    ) -> None:
        from infernetes.runtime.engine.engine_core import EngineCore

        stats = StatsBuffer()
        self.engine = EngineCore(config, [stats], data_parallel_rank)
        self.info = self.engine.info()
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._loop = CoreLoop(self.engine, stats, on_message)
        self._thread = threading.Thread(
            target=self._run, name="infernetes-engine-core", daemon=True
        )
        self._thread.start()

    def _next_command(self, timeout: float | None) -> EngineCommand | None:
        try:
            return self._commands.get(block=timeout != 0, timeout=timeout)
        except queue.Empty:
            return None

    def _run(self) -> None:
        self._loop.run(self._next_command)

    def send(self, command: EngineCommand) -> None:
        self._commands.put(command)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, hung: bool = False) -> None:
        """Shut the engine down; ``hung`` changes nothing here (a thread cannot be killed, so a
        hung one is waited for as long as any other)."""
        self.send(Shutdown())
        self._thread.join(JOIN_TIMEOUT_S)
        self.engine.shutdown()


class CoreProcess:
    """The engine core in a child process (spawned: a clean interpreter, no forked threads)."""

    def __init__(
        self,
        config: ServeConfig,
        on_message: Callable[[EngineMessage], None],
        data_parallel_rank: int = 0,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe(duplex=True)
        self._process = context.Process(
            target=run_core_process,
            args=(config, child_conn, LoggingSettings.from_env(), data_parallel_rank),
            name="infernetes-engine-core",
            daemon=True,
        )
        self._process.start()
        child_conn.close()
        self._send_lock = threading.Lock()
        self._stopping = False
        self.info = self._wait_ready()
        self._on_message = on_message
        self._reader = threading.Thread(
            target=self._read, name="infernetes-core-reader", daemon=True
        )
        self._reader.start()

    def _wait_ready(self) -> EngineInfo:
        try:
            if not self._conn.poll(READY_TIMEOUT_S):
                raise RuntimeError("the engine core process did not start in time")
            message = from_wire(pickle.loads(self._conn.recv_bytes()))
        except (EOFError, OSError) as error:
            self._process.join(JOIN_TIMEOUT_S)
            raise RuntimeError(
                f"the engine core process exited while loading (exit code {self._process.exitcode})"
            ) from error
        match message:
            case EngineReady(info=info):
                return info
            case LoadFailed(error=failure):
                self._process.join(JOIN_TIMEOUT_S)
                raise failure
        raise RuntimeError(f"the engine core process sent {message!r} before it was ready")

    def _read(self) -> None:
        on_message = self._on_message
        codec = OutputCodec()
        try:
            while True:
                message = from_wire(pickle.loads(self._conn.recv_bytes()))
                on_message(codec.unpack_message(message))
        except (EOFError, OSError):
            pass
        if not self._stopping:
            self._process.join(JOIN_TIMEOUT_S)
            exit_code = self._process.exitcode
            on_message(
                EngineDead(RuntimeError(f"the engine core process exited (exit code {exit_code})"))
            )

    def send(self, command: EngineCommand) -> None:
        if isinstance(command, AddRequest):  # a request that fails to unpickle there fails alone
            command = command._replace(
                request=pickle.dumps(command.request, protocol=pickle.HIGHEST_PROTOCOL)
            )
        data = pickle.dumps(to_wire(command), protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._conn.send_bytes(data)

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def stop(self, hung: bool = False) -> None:
        """Ask the core to shut down, and kill it if it has not within JOIN_TIMEOUT_S; a ``hung``
        core (it missed a deadline) is killed at once: it would not answer, and waiting for it
        only delays the exit and so the restart."""
        self._stopping = True
        if hung:
            logger.warning("killing the hung engine core process (pid %s)", self._process.pid)
        else:
            with contextlib.suppress(OSError):  # already gone
                self.send(Shutdown())
            self._process.join(JOIN_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(JOIN_TIMEOUT_S)
        self._conn.close()


class OutputCodec:
    """RequestOutputs as plain tuples over the pipe: pickling dataclasses costs twice as much, and
    the prompt (text and token ids) goes only with a request's first output instead of every
    step's; the receiving side keeps it until the request's final output."""

    def __init__(self) -> None:
        self.prompts: dict[str, tuple[str | None, list[int]]] = {}

    def pack(self, output: Any) -> Any:
        if isinstance(output, PoolingRequestOutput):
            # Once per request; as a numpy array, since a tensor would import torch on the API side.
            data = output.outputs.data
            array = data.numpy() if hasattr(data, "numpy") else data
            return dataclasses.replace(output, outputs=PoolingOutput(array))
        if not isinstance(output, RequestOutput):
            return output
        prompt = None
        if output.request_id not in self.prompts:
            prompt = (output.prompt, output.prompt_token_ids)
            self.prompts[output.request_id] = prompt
        if output.finished:
            del self.prompts[output.request_id]
        m = output.metrics
        return (
            output.request_id,
            prompt,
            output.prompt_logprobs,
            [
                (
                    c.index,
                    c.text,
                    c.token_ids,
                    c.cumulative_logprob,
                    c.logprobs,
                    c.finish_reason,
                    c.stop_reason,
                )
                for c in output.outputs
            ],
            output.finished,
            None
            if m is None
            else (
                m.arrival_time,
                m.last_token_time,
                m.first_scheduled_time,
                m.first_token_time,
                m.time_in_queue,
                m.finished_time,
                m.num_cached_tokens,
            ),
            output.num_cached_tokens,
            output.kv_transfer_params,
        )

    def unpack(self, packed: Any) -> Any:
        if not isinstance(packed, tuple):
            return packed
        (
            request_id,
            prompt,
            prompt_logprobs,
            completions,
            finished,
            metrics,
            num_cached,
            kv_transfer_params,
        ) = packed
        if prompt is None:
            prompt = self.prompts[request_id]
        if finished:
            self.prompts.pop(request_id, None)
        else:
            self.prompts[request_id] = prompt
        return RequestOutput(
            request_id,
            prompt[0],
            prompt[1],
            prompt_logprobs,
            [CompletionOutput(*c) for c in completions],
            finished,
            None if metrics is None else RequestMetrics(*metrics),
            num_cached,
            kv_transfer_params,
        )

    def pack_message(self, message: EngineMessage) -> EngineMessage:
        if isinstance(message, StepOutputs) and message.outputs:
            return StepOutputs([self.pack(o) for o in message.outputs], message.stats)
        return message

    def unpack_message(self, message: EngineMessage) -> EngineMessage:
        if isinstance(message, StepOutputs) and message.outputs:
            return StepOutputs([self.unpack(o) for o in message.outputs], message.stats)
        return message


PARENT_WATCH_INTERVAL_S = 1.0


# This process's engine once loaded (its executor is told when the API process vanishes).
_process_engine: EngineCore | None = None


def _abandon() -> None:
    """The API process is gone without a Shutdown: exit 1 at once, not stopping the ranks as if
    asked to (other nodes must see node 0 go, and exit 1; local worker processes follow their
    parent, this one), after stopping what would outlive this process (Ray's actors)."""
    if _process_engine is not None:
        with contextlib.suppress(BaseException):
            _process_engine.executor.abandon()
    os._exit(1)


def _exit_with_parent() -> None:
    """Exits this process once the API process is gone, whatever killed it (a SIGKILL runs no
    handler there): while the model loads, nothing reads the pipe that would tell us."""
    parent = multiprocessing.parent_process()
    parent_pid = parent.pid if parent is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == parent_pid:  # an orphan is re-parented
            threading.Event().wait(PARENT_WATCH_INTERVAL_S)
        _abandon()

    threading.Thread(target=watch, name="infernetes-parent-watch", daemon=True).start()


def run_core_process(
    config: ServeConfig,
    conn: Connection,
    logging_settings: LoggingSettings,
    data_parallel_rank: int = 0,
) -> None:
    """The core process's main over its pipe to the one API process."""
    codec = OutputCodec()

    def emit(message: EngineMessage) -> None:
        wire = to_wire(codec.pack_message(message))
        conn.send_bytes(pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL))

    def next_command(timeout: float | None) -> EngineCommand | None:
        if not conn.poll(timeout):
            return None
        return from_wire(pickle.loads(conn.recv_bytes()))

    serve_core(config, logging_settings, data_parallel_rank, emit, next_command)


def serve_core(
    config: ServeConfig,
    logging_settings: LoggingSettings,
    data_parallel_rank: int,
    emit: Callable[[EngineMessage], None],
    next_command: Callable[[float | None], EngineCommand | None],
) -> None:
    """A core process's work, whatever carries its messages: load the engine, say ready (or why
    not), then serve commands until shutdown or until the API side goes away (its channel
    closes, or the parent process exits)."""
    global _process_engine
    # The API process owns the signals: SIGTERM drains there first, then it stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    engine_tag = f"core {data_parallel_rank} " if config.data_parallel_size > 1 else "core "
    configure_logging(logging_settings, tag=f"{engine_tag}pid {os.getpid()}")
    logger.debug("engine core process started; loading %s", config.model)

    from infernetes.runtime.engine.engine_core import EngineCore

    stats = StatsBuffer()
    try:
        engine = EngineCore(config, [stats], data_parallel_rank)
    except BaseException as error:
        logger.exception("the engine failed to load")
        emit(LoadFailed(portable_error(error)))
        return
    _process_engine = engine
    emit(EngineReady(engine.info()))
    try:
        CoreLoop(engine, stats, emit).run(next_command)
    except (EOFError, OSError):  # the pipe closed: the API process was killed
        _abandon()
    finally:
        engine.shutdown()
