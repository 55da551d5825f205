"""Graceful shutdown with a deadline (``--shutdown-timeout``).

uvicorn alone, on SIGTERM, closes its listener and waits for in-flight requests without a limit
(and with ``timeout_graceful_shutdown`` it would cancel their tasks, cutting streams mid-way); in a
pod, the kubelet's SIGKILL at the end of the grace period cuts them either way. Here the first
SIGINT/SIGTERM starts a drain instead:

1. every new request, ``/health`` included, gets 503 (OpenAI error JSON, ``Connection: close``),
   so probes fail, load balancers take the pod out and clients retry elsewhere; the listener
   stays open until the end so that they get that answer rather than a refused connection;
2. requests in flight, streams included, have ``timeout_s`` seconds to finish;
3. the engine aborts what is left: each stream ends with a ``finish_reason: "abort"`` event and
   ``[DONE]``, a whole response with ``"abort"`` as its finish reason;
4. only then is uvicorn told to exit; the app's lifespan stops the engine core.

A second signal cuts step 2 short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from infernetes.runtime.server.errors import error_response

if TYPE_CHECKING:
    from infernetes.runtime.engine.async_engine import AsyncEngine

logger = logging.getLogger("infernetes.runtime.server")

# After the abort: how long the aborted streams get to send their last events.
ABORT_GRACE_S = 3.0
# A request still being tokenized at the deadline reaches the engine after the first abort;
# the abort is repeated at this interval until no HTTP request is left.
ABORT_RETRY_S = 0.2
# uvicorn's own limit once the drain is over (a client that stopped reading its stream); uvicorn
# takes whole seconds.
EXIT_GRACE_S = 2


class Drain:
    """The drain's state: the HTTP requests in flight, and whether new ones are refused."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.draining = False
        self.in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signal_name = ""
        # Made anew on the loop that serves (an app may be served by several loops in turn).
        self._started = asyncio.Event()
        self._cut_short = asyncio.Event()
        self._idle = asyncio.Event()

    # -- request accounting (DrainGate) -----------------------------------------------------

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    # -- signals -----------------------------------------------------------------------------

    def on_signal(self, sig: int) -> bool:
        """Called from the signal handler; False while no loop waits for it (still starting)."""
        if self._loop is None:
            return False
        self._loop.call_soon_threadsafe(self._signalled, signal.Signals(sig).name)
        return True

    def _signalled(self, name: str) -> None:
        if self._started.is_set():
            logger.info("%s again: aborting the requests still in flight now", name)
            self._cut_short.set()
        else:
            self._signal_name = name
            self._started.set()

    # -- the drain ---------------------------------------------------------------------------

    async def run_on_signal(self, engine_of: Callable[[], Any]) -> None:
        """Waits for the first signal, then drains the engine ``engine_of()`` returns then (None
        while the model loads) and returns."""
        self._started, self._cut_short = asyncio.Event(), asyncio.Event()
        self._loop = asyncio.get_running_loop()
        await self._started.wait()
        await self.drain(engine_of())

    async def drain(self, engine: AsyncEngine) -> None:
        self.draining = True  # from here on in_flight only goes down
        self._idle = asyncio.Event()
        if self.in_flight == 0:
            self._idle.set()
        loop = asyncio.get_running_loop()
        began = loop.time()
        at_start = self.in_flight
        logger.info(
            "%s: draining %d request(s) in flight for at most %g s (--shutdown-timeout), "
            "then aborting the rest; new requests get 503",
            self._signal_name or "shutdown",
            at_start,
            self.timeout_s,
        )
        await _first_of([self._idle, self._cut_short], self.timeout_s)
        left = self.in_flight
        if left:
            await self._abort_all(engine)
        logger.info(
            "drain over after %.1f s: %d request(s) finished, %d aborted",
            loop.time() - began,
            at_start - left,
            left,
        )

    async def _abort_all(self, engine: AsyncEngine) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + ABORT_GRACE_S
        while self.in_flight and loop.time() < give_up:
            ids = engine.request_ids() if engine is not None else []
            if ids:
                with contextlib.suppress(RuntimeError):  # the engine died meanwhile: streams end
                    await engine.abort(ids)
            await _first_of([self._idle], ABORT_RETRY_S)


async def _first_of(events: list[asyncio.Event], timeout: float) -> None:
    """Returns when one of ``events`` is set or after ``timeout`` seconds."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class DrainGate:
    """ASGI middleware: counts the HTTP requests in flight; once draining, refuses new ones."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            response = error_response(
                "the server is shutting down; retry on another replica",
                503,
                headers={"connection": "close"},
            )
            await response(scope, receive, send)
            return
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.leave()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGINT/SIGTERM handed to the drain. uvicorn's own handler would also
    re-raise the signal once shut down, so the process would end killed by it instead of 0."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.drain.on_signal(sig):
            self.should_exit = True  # before the app started: nothing to drain
