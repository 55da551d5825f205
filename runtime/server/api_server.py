"""The OpenAI-compatible HTTP server: ``build_app`` (the FastAPI app, for tests and embedding)
and ``run_server(config)`` (what ``infernetes serve`` calls).

Lifecycle: the port is bound first (busy: exit 1 before anything loads), uvicorn serves on it at
once and ``/health`` answers 503 while the model loads;
once the engine is up every route answers. If the engine dies, ``/health`` fails and the server
exits (unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH) so Kubernetes restarts the pod. SIGTERM/SIGINT
drain: new requests get 503, in-flight ones have ``--shutdown-timeout`` seconds to finish, the
rest are aborted, then the engine shuts down and the process exits 0 (``shutdown.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import logging.config
import multiprocessing
import os
import socket
import ssl
import stat
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from infernetes.runtime.logging_config import LoggingSettings, apply_log_level, configure_logging
from infernetes.runtime.preflight import check_settings
from infernetes.runtime.server.errors import install_error_handlers
from infernetes.runtime.server.http_protocol import HeaderDeadlineProtocol
from infernetes.runtime.server.log_stats import LoggingStatLogger
from infernetes.runtime.server.memory import ReleaseMemoryMiddleware
from infernetes.runtime.server.middleware import (
    APIKeyMiddleware,
    APIServerHeader,
    ConcurrencyLimitMiddleware,
    RequestBodyMiddleware,
    RequestIdMiddleware,
    ServerLoadMiddleware,
    TraceContextMiddleware,
    import_user_middleware,
)
from infernetes.runtime.server.routes import include_routes
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.shutdown import EXIT_GRACE_S, Drain, DrainGate, DrainingServer
from infernetes.runtime.server.state import ServerState

from infernetes import __version__
from infernetes.cli.config import render as masked_config
from infernetes.schema.config import ServeConfig

if TYPE_CHECKING:
    from infernetes.runtime.engine.shared_core import SharedCoreLink

logger = logging.getLogger("infernetes.runtime.server")

ENGINE_WATCH_INTERVAL_S = 0.5
SSL_WATCH_INTERVAL_S = 2.0
CHILD_JOIN_S = 10.0


def build_app(
    state: ServerState,
    engine: Any = None,
    engine_loader: Callable[[], Any] | None = None,
) -> FastAPI:
    """The app over ``engine`` (already loaded) or over what ``engine_loader`` returns (called
    in a worker thread at startup, so probes answer while the model loads)."""
    settings = state.settings
    docs = not settings.disable_fastapi_docs

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if engine is not None:
            await state.load_lora_modules(engine)
            state.attach_engine(engine)
        elif engine_loader is not None:
            tasks.append(asyncio.create_task(_load_engine(state, engine_loader)))
        tasks.append(asyncio.create_task(_watch_engine(app, state)))
        tasks.append(asyncio.create_task(_drain_on_signal(app, state)))
        uvicorn_server = getattr(app.state, "uvicorn_server", None)
        if settings.enable_ssl_refresh and settings.ssl_certfile and uvicorn_server is not None:
            watch = _watch_certificates(uvicorn_server, settings.ssl_certfile, settings)
            tasks.append(asyncio.create_task(watch))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            if state.engine is not None and engine_loader is not None:
                await state.engine.shutdown()
            elif engine_loader is not None:
                _stop_loading_children()

    app = FastAPI(
        title="infernetes OpenAI-compatible API",
        version=__version__,
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.server = state
    app.state.server_load = 0
    app.state.drain = Drain(settings.shutdown_timeout)
    install_error_handlers(app)
    include_routes(app, settings.dev_mode)
    # add_middleware wraps: the last added runs first. Order, outermost first: CORS (so even a
    # 401 carries CORS headers and preflights never need a key), the drain gate (it counts every
    # request, and refuses new ones during a shutdown), request id, auth, the whole
    # body read (bounded in size and time, before a slot is taken), the memory release after a
    # large body, load tracking, concurrency limit (after auth, so a bad key is a 401, not a
    # 429), user middleware.
    import_user_middleware(app, settings.middleware)
    app.add_middleware(TraceContextMiddleware)
    if settings.max_concurrency is not None:
        app.add_middleware(ConcurrencyLimitMiddleware, limit=settings.max_concurrency)
    if settings.enable_server_load_tracking:
        app.add_middleware(ServerLoadMiddleware, state=app.state)
    app.add_middleware(ReleaseMemoryMiddleware)
    app.add_middleware(RequestBodyMiddleware)
    if settings.api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=settings.api_keys)
    if settings.enable_request_id_headers:
        app.add_middleware(RequestIdMiddleware)
    app.add_middleware(DrainGate, drain=app.state.drain)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.allowed_origins),
        allow_credentials=settings.allow_credentials,
        allow_methods=list(settings.allowed_methods),
        allow_headers=list(settings.allowed_headers),
    )
    return app


async def _load_engine(state: ServerState, loader: Callable[[], Any]) -> None:
    start = time.monotonic()
    try:
        engine = await _in_daemon_thread(loader)
        await state.load_lora_modules(engine)
        state.attach_engine(engine)
        logger.info(
            "model loaded in %.1f s; serving %s",
            time.monotonic() - start,
            ", ".join(state.settings.served_model_names),
        )
    except Exception as exc:
        logger.exception("the model failed to load")
        state.load_error = exc


def _in_daemon_thread(work: Callable[[], Any]) -> asyncio.Future:
    """``work()`` in a daemon thread: a shutdown while the model loads neither waits for the load
    to finish (asyncio.to_thread's executor is joined at exit) nor keeps the process alive."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="infernetes-engine-load", daemon=True).start()
    return future


def _stop_loading_children() -> None:
    """A shutdown before the engine is up: the engine-core process is still loading and nothing
    owns it yet, so it is killed here (it ignores SIGTERM: the API process owns the signals)."""
    for child in multiprocessing.active_children():
        logger.info("stopping %s (pid %s) while it loads", child.name, child.pid)
        child.kill()
        child.join(CHILD_JOIN_S)


async def _watch_engine(app: FastAPI, state: ServerState) -> None:
    """Stops the server when the engine dies, unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set."""
    while True:
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
        dead = state.load_error is not None or getattr(state.engine, "errored", False)
        if not dead:
            continue
        if state.settings.keep_alive_on_engine_death:
            continue
        logger.error(
            "the engine is dead (%s); shutting the server down",
            state.load_error or getattr(state.engine, "dead_error", None),
        )
        uvicorn_server = getattr(app.state, "uvicorn_server", None)
        if uvicorn_server is not None:
            uvicorn_server.should_exit = True
        return


async def _drain_on_signal(app: FastAPI, state: ServerState) -> None:
    """On SIGINT/SIGTERM: drain (shutdown.py), then let uvicorn close the listener and exit."""
    await app.state.drain.run_on_signal(lambda: state.engine)
    uvicorn_server = getattr(app.state, "uvicorn_server", None)
    if uvicorn_server is not None:
        uvicorn_server.should_exit = True


async def _watch_certificates(
    uvicorn_server: Any, certfile: str, settings: FrontendSettings
) -> None:
    """--enable-ssl-refresh: reload the certificate chain into the live context on change."""
    paths = [p for p in (settings.ssl_certfile, settings.ssl_keyfile, settings.ssl_ca_certs) if p]

    def stamp() -> tuple:
        return tuple(os.stat(p).st_mtime_ns if os.path.exists(p) else 0 for p in paths)

    seen = stamp()
    while True:
        await asyncio.sleep(SSL_WATCH_INTERVAL_S)
        now = stamp()
        if now == seen:
            continue
        seen = now
        context: ssl.SSLContext | None = getattr(uvicorn_server.config, "ssl", None)
        if context is None:
            continue
        try:
            context.load_cert_chain(certfile, settings.ssl_keyfile)
            if settings.ssl_ca_certs:
                context.load_verify_locations(settings.ssl_ca_certs)
            logger.info("reloaded the TLS certificate")
        except (OSError, ssl.SSLError) as exc:
            logger.error("could not reload the TLS certificate: %s", exc)


def uvicorn_config(app: FastAPI, settings: FrontendSettings) -> Any:
    import uvicorn

    log_config = uvicorn.config.LOGGING_CONFIG
    if settings.log_config_file:
        with open(settings.log_config_file) as handle:
            log_config = json.load(handle)
    return uvicorn.Config(
        app,
        host=settings.host or "0.0.0.0",
        port=settings.port,
        log_level=settings.uvicorn_log_level,
        access_log=not settings.disable_uvicorn_access_log,
        root_path=settings.root_path or "",
        ssl_keyfile=settings.ssl_keyfile,
        ssl_certfile=settings.ssl_certfile,
        ssl_ca_certs=settings.ssl_ca_certs,
        ssl_cert_reqs=settings.ssl_cert_reqs,
        ssl_ciphers=settings.ssl_ciphers,
        log_config=log_config,
        timeout_keep_alive=settings.http_keep_alive_s,
        http=HeaderDeadlineProtocol,
        timeout_graceful_shutdown=EXIT_GRACE_S,
    )


def configure_server_logging(
    settings: FrontendSettings, logging_settings: LoggingSettings, tag: str = ""
) -> None:
    """The VLLM_* logging variables (as in the engine-core process), then --log-config-file,
    which uvicorn applies too; ``tag`` marks the lines of one of several API processes."""
    configure_logging(logging_settings, tag=tag)
    if settings.log_config_file:
        with open(settings.log_config_file) as handle:
            logging.config.dictConfig(json.load(handle))


def _cache_config_labels(config: ServeConfig) -> dict[str, Any]:
    cache = config.grouped().get("CacheConfig", {})
    return {
        key: value for key, value in cache.items() if not isinstance(value, dict | list | tuple)
    }


class QuietAccessLines(logging.Filter):
    """Drops the access-log lines of --disable-access-log-for-endpoints' paths, and of the probes
    while the model loads: the kubelet (or ``make serve``'s wait) asks every second and each 503
    would be a line."""

    PROBES = frozenset({"/health", "/ping"})

    def __init__(self, state: ServerState) -> None:
        super().__init__()
        self.state = state

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's access record: (client, method, path with query, HTTP version, status)
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) != 5:
            return True
        path = str(args[2]).split("?")[0]
        loading = self.state.engine is None and self.state.load_error is None
        quiet = self.state.settings.quiet_access_paths
        return path not in quiet and not (loading and path in self.PROBES)


def listen(settings: FrontendSettings) -> socket.socket:
    """The server's socket: --uds's Unix socket (host and port are then unused, as in vLLM), or
    --host and --port."""
    if settings.uds:
        return _unix_socket(settings.uds)
    return _listening_socket(settings.host or "0.0.0.0", settings.port)


def _unix_socket(path: str) -> socket.socket:
    """A Unix socket at ``path``, readable and writable by every local user (as uvicorn's); a
    socket file left by an earlier run is replaced."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.remove(path)
        listener.bind(path)
        os.chmod(path, 0o666)
    except OSError as exc:
        listener.close()
        print(
            f"infernetes serve: error: cannot listen on {path}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        raise SystemExit(1) from exc
    return listener


def _listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything loads: a busy port is exit 1 at once, naming
    it (uvicorn binds only after the app's startup, which begins loading the model)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as exc:
        print(
            f"infernetes serve: error: cannot listen on {host}:{port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        raise SystemExit(1) from exc
    return listener


def run_server(config: ServeConfig) -> None:
    """Serve ``config`` (a ServeConfig) until SIGINT/SIGTERM or engine death; with
    ``--api-server-count`` above 1, as the supervisor of that many API processes
    (``api_servers.py``)."""
    try:
        check_settings(config)  # what `infernetes config` checks too
        settings = FrontendSettings.from_config(config)
        apply_log_level(config.log_level)
        logging_settings = LoggingSettings.from_env()
    except ValueError as exc:
        print(f"infernetes serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    configure_server_logging(settings, logging_settings)
    listener = listen(settings)
    scheme = "https" if settings.ssl_certfile else "http"
    if settings.uds:
        logger.info("listening on %s over the Unix socket %s", scheme, settings.uds)
    else:
        logger.info("listening on %s://%s:%d", scheme, settings.host or "0.0.0.0", settings.port)
    if config.api_server_count > 1:
        from infernetes.runtime.server.api_servers import run_api_servers

        raise SystemExit(run_api_servers(config, listener))
    serve_on(config, settings, listener)


def serve_on(
    config: ServeConfig,
    settings: FrontendSettings,
    listener: socket.socket,
    core_link: SharedCoreLink | None = None,
) -> None:
    """This process's HTTP server on ``listener``, over its own engine core or, with
    ``core_link``, the one it shares with other API processes."""
    state = ServerState(
        settings, cache_config=_cache_config_labels(config), serve_config=masked_config(config)
    )
    if not settings.disable_log_stats:
        state.stat_fanout.loggers.append(LoggingStatLogger())

    def load() -> Any:
        from infernetes.runtime.engine.async_engine import AsyncEngine, core_process_enabled

        return AsyncEngine.from_config(
            config,
            stat_loggers=[state.stat_fanout],
            multiprocess=core_process_enabled(),
            core_link=core_link,
        )

    app = build_app(state, engine_loader=load)
    if core_link is not None:
        app.add_middleware(APIServerHeader, index=core_link.server)
    server = DrainingServer(uvicorn_config(app, settings), app.state.drain)
    logging.getLogger("uvicorn.access").addFilter(QuietAccessLines(state))
    app.state.uvicorn_server = server

    # uvicorn picks its event loop (uvloop when installed); SIGINT/SIGTERM start the drain.
    server.run(sockets=[listener])
    if state.load_error is not None or getattr(state.engine, "errored", False):
        raise SystemExit(1)
