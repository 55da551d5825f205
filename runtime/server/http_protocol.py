"""uvicorn's httptools protocol with a deadline on request headers.

uvicorn closes a connection that sits idle after a response (``timeout_keep_alive``), but not one
that opens and never finishes its request line and headers: 500 such sockets would stay open for
good. Here each request's headers must be complete within ``HEADER_TIMEOUT_S`` of the connection
opening or the request's first byte, or the connection is closed. (The body has its own deadline,
in ``middleware.RequestBodyMiddleware``.)
"""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = float(os.environ.get("INFERNETES_HTTP_HEADER_TIMEOUT_S", 30))


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_too_slow(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()
