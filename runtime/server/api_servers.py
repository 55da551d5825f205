"""``--api-server-count N`` (N > 1): N API server processes in front of one engine core, as vLLM
runs them.

The ``serve`` process binds the listening socket once, starts the engine core
(``shared_core.run_shared_core_process``) and N API processes, each with the whole HTTP API on
that same socket (the kernel hands each connection to one of them) and a ``SharedCoreClient``
to the core; then it only supervises. Each response says which process made it
(``X-API-Server``). The engine's statistics go to API process 0 alone; every process's
``/metrics`` reads all processes' Prometheus files (``PROMETHEUS_MULTIPROC_DIR``, a private
folder), so any of them reports the engine's counters once.

SIGTERM or SIGINT is passed to every API process, which drains as a single server does; once
they are gone the core stops (it waits for every API process's shutdown). When any process
exits unasked, the others are stopped and ``serve`` exits 1, so Kubernetes restarts the pod.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
from typing import Any

from infernetes.runtime.engine.core_client import JOIN_TIMEOUT_S, _exit_with_parent
from infernetes.runtime.engine.shared_core import SharedCoreLink, run_shared_core_process
from infernetes.runtime.logging_config import LoggingSettings
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.shutdown import EXIT_GRACE_S

from infernetes.schema.config import ServeConfig

logger = logging.getLogger("infernetes.runtime.server")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def run_api_servers(config: ServeConfig, listener: socket.socket) -> int:
    """Start the core and ``config.api_server_count`` API processes on ``listener``, and wait:
    the exit code of ``serve``."""
    count = config.api_server_count
    ipc_dir = tempfile.mkdtemp(prefix="infernetes-api-")
    metrics_dir = os.path.join(ipc_dir, "metrics")
    os.mkdir(metrics_dir)
    os.environ[MULTIPROC_ENV] = metrics_dir  # read as the API processes import prometheus_client
    context = multiprocessing.get_context("spawn")
    core = context.Process(
        target=run_shared_core_process,
        args=(config, ipc_dir, count, LoggingSettings.from_env()),
        name="infernetes-engine-core",
        daemon=True,
    )
    core.start()
    assert core.pid is not None  # started
    servers = [
        context.Process(
            target=run_api_server_process,
            args=(config, listener, SharedCoreLink(ipc_dir, index, core.pid)),
            name=f"infernetes-api-server-{index}",
        )
        for index in range(count)
    ]
    for server in servers:
        server.start()
    logger.info("%d API server processes (pids %s)", count, [s.pid for s in servers])
    try:
        return _supervise(core, servers, config.shutdown_timeout)
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)


def _supervise(core: Any, servers: list[Any], shutdown_timeout: float) -> int:
    asked = False

    def stop_servers(signum: int = signal.SIGTERM, frame: Any = None) -> None:
        nonlocal asked
        asked = asked or frame is not None  # a signal to serve, not a process gone
        for server in servers:
            if server.is_alive():
                os.kill(server.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_servers)
    signal.signal(signal.SIGINT, stop_servers)
    processes = {p.sentinel: p for p in [core, *servers]}
    [gone] = multiprocessing.connection.wait(list(processes))[:1]
    if not asked:
        process = processes[gone]
        process.join()
        logger.error(
            "%s exited (exit code %s); stopping the server", process.name, process.exitcode
        )
        stop_servers()
    for server in servers:
        server.join(shutdown_timeout + EXIT_GRACE_S + JOIN_TIMEOUT_S)
        if server.is_alive():
            server.kill()
            server.join()
    core.join(JOIN_TIMEOUT_S)  # it stops once every API process has said so
    if core.is_alive():
        core.kill()
        core.join()
    clean = asked and all(server.exitcode == 0 for server in servers)
    return 0 if clean else 1


def run_api_server_process(
    config: ServeConfig, listener: socket.socket, link: SharedCoreLink
) -> None:
    """An API process's main: the HTTP server of ``api_server.serve_on`` over the shared core."""
    from infernetes.runtime.server.api_server import configure_server_logging, serve_on

    _exit_with_parent()  # the supervisor killed outright: nobody would stop this one
    settings = FrontendSettings.from_config(config)
    tag = f"api {link.server} pid {os.getpid()}"
    configure_server_logging(settings, LoggingSettings.from_env(), tag)
    serve_on(config, settings, listener, link)
