"""One engine core behind several API server processes (``--api-server-count N``, vLLM's layout).

The core process binds one ZMQ PULL socket for the commands of all N API processes (each one
tagged with its sender's index) and pushes messages to each API process's own PULL socket, all
over Unix-domain (``ipc://``) sockets in a private folder. ``CoreRouter`` is the core's side: a
request's outputs go to the API process that added it, a reply to the one that asked, each
step's statistics to API process 0 alone (so the engine's counters are counted once; the
others read them through Prometheus' multiprocess files), and ``EngineReady``/``LoadFailed``/
``EngineDead`` to all. The core shuts down once every API process has said ``Shutdown``.
``SharedCoreClient`` is an API process's side, with ``CoreProcess``'s interface.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import zmq
from infernetes.runtime.engine.core_client import (
    JOIN_TIMEOUT_S,
    READY_TIMEOUT_S,
    OutputCodec,
    serve_core,
)
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
    UtilityReply,
    from_wire,
    to_wire,
)
from infernetes.runtime.logging_config import LoggingSettings

from infernetes.schema.config import ServeConfig

logger = logging.getLogger(__name__)

# How often an API process's reader looks whether the core process is still there.
CORE_WATCH_INTERVAL_S = 1.0


class SharedCoreLink(NamedTuple):
    """Where API process ``server`` finds the shared core: the sockets' folder, its pid."""

    ipc_dir: str
    server: int
    core_pid: int


def commands_address(ipc_dir: str | Path) -> str:
    return f"ipc://{Path(ipc_dir) / 'commands'}"


def outputs_address(ipc_dir: str | Path, client: int) -> str:
    return f"ipc://{Path(ipc_dir) / f'outputs-{client}'}"


class CoreRouter:
    """The core's channel to ``clients`` API processes: ``next_command`` and ``emit`` for
    ``serve_core``."""

    def __init__(self, ipc_dir: str | Path, clients: int) -> None:
        self.context = zmq.Context()
        self.commands = self.context.socket(zmq.PULL)
        self.commands.bind(commands_address(ipc_dir))
        # connect() queues messages until the API process binds its end.
        self.outputs = []
        for client in range(clients):
            push = self.context.socket(zmq.PUSH)
            push.connect(outputs_address(ipc_dir, client))
            self.outputs.append(push)
        self.codec = OutputCodec()  # request ids are unique across the API processes
        self.owners: dict[str, int] = {}  # request id -> the API process that added it
        self.sender = 0  # the API process whose command is being handled
        self.shut_down: set[int] = set()

    def next_command(self, timeout: float | None) -> EngineCommand | None:
        while self.commands.poll(None if timeout is None else int(timeout * 1000)):
            client, request_id, wire = pickle.loads(self.commands.recv())
            command = from_wire(wire)
            if isinstance(command, Shutdown):
                self.shut_down.add(client)
                if len(self.shut_down) < len(self.outputs):
                    timeout = 0
                    continue  # the others are still serving
                return command
            self.sender = client
            if request_id is not None:
                self.owners[request_id] = client
            return command
        return None

    def emit(self, message: EngineMessage) -> None:
        match message:
            case StepOutputs(outputs=outputs, stats=stats):
                by_client: dict[int, list[Any]] = {}
                for output in outputs:
                    if output.finished:
                        client = self.owners.pop(output.request_id, 0)
                    else:
                        client = self.owners.get(output.request_id, 0)
                    by_client.setdefault(client, []).append(output)
                if stats:  # the engine's statistics, counted once: by API process 0
                    by_client.setdefault(0, [])
                for client, mine in by_client.items():
                    self._send(client, StepOutputs(mine, stats if client == 0 else []))
            case UtilityReply():
                self._send(self.sender, message)
            case _:
                for client in range(len(self.outputs)):
                    self._send(client, message)

    def _send(self, client: int, message: EngineMessage) -> None:
        wire = to_wire(self.codec.pack_message(message))
        self.outputs[client].send(pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL))


def run_shared_core_process(
    config: ServeConfig, ipc_dir: str, clients: int, logging_settings: LoggingSettings
) -> None:
    """The shared core process's main."""
    router = CoreRouter(ipc_dir, clients)
    try:
        serve_core(config, logging_settings, 0, router.emit, router.next_command)
    finally:
        router.context.destroy(linger=0)


class SharedCoreClient:
    """API process ``index``'s link to the shared core process (``CoreProcess``'s interface:
    ``info``, ``send``, ``alive``, ``pid``, ``stop``)."""

    def __init__(self, link: SharedCoreLink, on_message: Callable[[EngineMessage], None]) -> None:
        self.index = link.server
        self.core_pid = link.core_pid
        self._context = zmq.Context()
        self._outputs = self._context.socket(zmq.PULL)
        self._outputs.bind(outputs_address(link.ipc_dir, link.server))
        self._commands = self._context.socket(zmq.PUSH)
        self._commands.connect(commands_address(link.ipc_dir))
        self._send_lock = threading.Lock()  # commands come from the loop and worker threads
        self._stopping = False
        self.info = self._wait_ready()
        self._on_message = on_message
        self._reader = threading.Thread(
            target=self._read, name="infernetes-core-reader", daemon=True
        )
        self._reader.start()

    def _receive(self) -> EngineMessage:
        return from_wire(pickle.loads(self._outputs.recv()))

    def _wait_ready(self) -> EngineInfo:
        waited = 0.0
        while not self._outputs.poll(int(CORE_WATCH_INTERVAL_S * 1000)):
            waited += CORE_WATCH_INTERVAL_S
            if not self.alive:
                raise RuntimeError("the engine core process exited while loading")
            if waited > READY_TIMEOUT_S:
                raise RuntimeError("the engine core process did not start in time")
        match self._receive():
            case EngineReady(info=info):
                return info
            case LoadFailed(error=failure):
                raise failure
            case message:
                raise RuntimeError(f"the engine core process sent {message!r} before it was ready")

    def _read(self) -> None:
        codec = OutputCodec()
        while not self._stopping:
            try:
                if not self._outputs.poll(int(CORE_WATCH_INTERVAL_S * 1000)):
                    if not self.alive and not self._stopping:
                        break
                    continue
                message = self._receive()
            except zmq.ZMQError:  # closed by stop()
                return
            self._on_message(codec.unpack_message(message))
        if not self._stopping:
            self._on_message(EngineDead(RuntimeError("the engine core process exited")))

    def send(self, command: EngineCommand) -> None:
        request_id = None
        if isinstance(command, AddRequest) and not isinstance(command.request, bytes):
            request_id = command.request.request_id
            # a request that fails to unpickle there fails alone
            command = command._replace(
                request=pickle.dumps(command.request, protocol=pickle.HIGHEST_PROTOCOL)
            )
        data = pickle.dumps(
            (self.index, request_id, to_wire(command)), protocol=pickle.HIGHEST_PROTOCOL
        )
        with self._send_lock:
            try:
                self._commands.send(data)
            except zmq.ZMQError as error:
                raise OSError(f"the engine core link is closed: {error}") from error

    @property
    def alive(self) -> bool:
        try:
            os.kill(self.core_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def pid(self) -> int:
        return self.core_pid

    def stop(self, hung: bool = False) -> None:
        """Tell the core this API process is done (it stops once all are); a ``hung`` core is
        killed, which ends the other API processes too (the supervisor sees it go)."""
        self._stopping = True
        if hung:
            logger.warning("killing the hung engine core process (pid %s)", self.core_pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.core_pid, signal.SIGKILL)
        else:
            with contextlib.suppress(OSError):
                self.send(Shutdown())
        self._reader.join(JOIN_TIMEOUT_S)
        self._context.destroy(linger=int(JOIN_TIMEOUT_S * 1000) if not hung else 0)
