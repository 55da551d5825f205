"""ASGI middleware: API-key auth, request-id headers, the request body (size and time limits),
server-load tracking, the ``--max-concurrency`` limit, and user middleware named by ``--middleware``.

Plain ASGI classes rather than BaseHTTPMiddleware, so streamed responses pass through untouched
and a cancelled client still cancels the handler.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import FastAPI
from infernetes.runtime.qualified_import import import_qualified
from infernetes.runtime.server.errors import error_body
from infernetes.runtime.tracing import TRACE_HEADERS, trace_headers

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Routes that stay open with --api-key: probes, version, metrics and the API docs.
OPEN_PATHS = frozenset(
    {
        "/health",
        "/ping",
        "/version",
        "/metrics",
        "/load",
        "/docs",
        "/redoc",
        "/openapi.json",
        "/docs/oauth2-redirect",
    }
)
# Routes whose in-flight count is the server load (--enable-server-load-tracking).
# Routes that occupy the engine, counted against --max-concurrency.
GENERATION_PATHS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/pooling",
        "/invocations",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/classify",
    }
)
INFERENCE_PATHS = GENERATION_PATHS | {"/tokenize", "/detokenize"}
MAX_BODY_BYTES = 32 * 1024 * 1024
# Time for a whole request body to arrive: 32 MB at ~1 MB/s, with room to spare.
BODY_TIMEOUT_S = float(os.environ.get("INFERNETES_HTTP_BODY_TIMEOUT_S", 60))


def _route_path(scope: Scope) -> str:
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path.rstrip("/") or "/"


async def _send_error(send: Send, message: str, status: int, headers: Iterable = ()) -> None:
    body = json.dumps(error_body(message, status)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` on every route except OPEN_PATHS."""

    def __init__(self, app: ASGIApp, api_keys: Iterable[str]) -> None:
        self.app = app
        self.tokens = [f"Bearer {key}".encode() for key in api_keys]

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        # Compare against every key without short-circuiting, so timing reveals nothing.
        matches = [hmac.compare_digest(given, token) for token in self.tokens]
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") == "OPTIONS"
            or _route_path(scope) in OPEN_PATHS
            or self._authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        await _send_error(
            send,
            "Unauthorized: a valid API key is required (header 'Authorization: Bearer <key>')",
            401,
            [(b"www-authenticate", b"Bearer")],
        )


class RequestIdMiddleware:
    """Echoes ``X-Request-Id`` (or a new one) on every response (--enable-request-id-headers)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = next(
            (v for k, v in scope.get("headers", ()) if k == b"x-request-id"),
            uuid.uuid4().hex.encode(),
        )

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


class APIServerHeader:
    """Names the API process that answered (``X-API-Server: <index>``) when
    ``--api-server-count`` runs several behind one socket."""

    def __init__(self, app: ASGIApp, index: int) -> None:
        self.app = app
        self.value = str(index).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_index(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-api-server", self.value)]
            await send(message)

        await self.app(scope, receive, send_with_index)


class TraceContextMiddleware:
    """Keeps the request's W3C trace context (``traceparent``, ``tracestate``) where the engine
    reads it as the request enters (``tracing.trace_headers``), so its span continues the
    caller's trace."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key in _TRACE_HEADER_KEYS
        }
        token = trace_headers.set(headers or None)
        try:
            await self.app(scope, receive, send)
        finally:
            trace_headers.reset(token)


_TRACE_HEADER_KEYS = frozenset(name.encode() for name in TRACE_HEADERS)


class RequestBodyMiddleware:
    """Reads each request's whole body before the app sees it: at most ``max_bytes`` (413, by
    Content-Length or by what arrives, chunked or not) within ``timeout_s`` (408, and the
    connection is closed). A slow or stalled client so holds no ``--max-concurrency`` slot and no
    handler while its body trickles in; the app then reads the body from memory."""

    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_error(
                    send,
                    f"request body of {int(value)} bytes exceeds the limit "
                    f"of {self.max_bytes} bytes",
                    413,
                    [(b"connection", b"close")],
                )
                return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except _BodyTooLarge:
            await _send_error(
                send,
                f"request body exceeds the limit of {self.max_bytes} bytes",
                413,
                [(b"connection", b"close")],
            )
            return
        except TimeoutError:
            await _send_error(
                send,
                f"the request body did not arrive within {self.timeout_s:g} s",
                408,
                [(b"connection", b"close")],
            )
            return
        except _ClientGone:
            return
        delivered = False

        async def buffered_receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # from here on only a disconnect can arrive

        await self.app(scope, buffered_receive, send)

    async def _read(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class ServerLoadMiddleware:
    """Counts in-flight inference requests in ``app.state.server_load`` (served by GET /load)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state
        self.state.server_load = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _route_path(scope) not in INFERENCE_PATHS:
            await self.app(scope, receive, send)
            return
        self.state.server_load += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.server_load -= 1


class ConcurrencyLimitMiddleware:
    """``--max-concurrency``: at most ``limit`` requests in flight on the inference routes; one
    more is refused at once with 429 (the client retries, as with any rate limit). A request holds
    its slot until its response has been sent in full, a stream until its last event, and gives it
    back however it ends: finished, failed, or cut by its client (the ASGI call returns or raises
    in every case)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"--max-concurrency must be at least 1, got {limit}")
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or _route_path(scope) not in GENERATION_PATHS
        ):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await _send_error(
                send,
                f"Too many concurrent requests: the server processes at most {self.limit} "
                f"at once (--max-concurrency {self.limit}); retry later",
                429,
                [(b"retry-after", b"1")],
            )
            return
        # No await between the check and the increment: the event loop cannot interleave them.
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def import_user_middleware(app: FastAPI, qualified_names: Iterable[str]) -> None:
    """Adds each ``--middleware module.attr``: a class is ASGI middleware, a coroutine function
    is an HTTP middleware ``(request, call_next)``, as in vLLM."""
    for qualified in qualified_names:
        target = resolve_user_middleware(qualified)
        if inspect.isclass(target):
            # A user's class: nothing is known of its signature until starlette builds it.
            app.add_middleware(target)  # type: ignore[arg-type]
        else:
            app.middleware("http")(target)


def resolve_user_middleware(qualified: str) -> Any:
    """The class or coroutine function ``--middleware module.attr`` names; ValueError saying what
    is wrong otherwise (checked before anything loads, by ``serve`` and ``config`` alike)."""
    target = import_qualified("--middleware", qualified)
    if not (inspect.isclass(target) or inspect.iscoroutinefunction(target)):
        raise ValueError(f"--middleware {qualified!r} must be a class or an async function")
    return target
