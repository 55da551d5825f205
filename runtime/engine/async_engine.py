"""AsyncEngine: the asyncio front of the synchronous engine core.

One thread owns the LLMEngine and runs its loop: it takes commands (add, abort, reset, sleep...)
from a thread-safe queue, steps while there is work, and hands each RequestOutput to the asyncio
queue of the request's stream on that stream's event loop. Nothing else touches the engine, so the
core stays single-threaded. When a step raises, the engine is dead: every open stream gets the
error, ``errored`` turns true and ``dead_error`` says why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.outputs import PoolingRequestOutput, RequestOutput
from infernetes.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an error; no request can be served any more."""


class _Stream:
    __slots__ = ("loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.model_config = engine.model_config
        self.config = engine.config
        self.is_pooling = engine.is_pooling
        self.default_sampling_params: dict[str, Any] = dict(engine.default_sampling_params)
        self.dead_error: BaseException | None = None
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future | None]] = (
            queue.SimpleQueue()
        )
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="infernetes-engine-core", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Any, stat_loggers: Sequence[Any] = ()) -> AsyncEngine:
        return cls(LLMEngine.from_config(config, stat_loggers=stat_loggers))

    # -- state ---------------------------------------------------------------------------------

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self.errored

    @property
    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping

    def _check_alive(self) -> None:
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine has stopped: {self.dead_error!r}") from self.dead_error
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")

    # -- the engine thread ---------------------------------------------------------------------

    def _submit(self, command: Callable[[], Any], wait: bool = True) -> concurrent.futures.Future | None:
        future = concurrent.futures.Future() if wait else None
        self._commands.put((command, future))
        self._wakeup.set()
        return future

    async def _call(self, command: Callable[[], Any]) -> Any:
        self._check_alive()
        return await asyncio.wrap_future(self._submit(command))

    def _run_commands(self) -> None:
        while True:
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future is not None and not future.set_running_or_notify_cancel():
                continue
            try:
                result = command()
            except Exception as error:
                if future is None:
                    logger.exception("engine command failed")
                else:
                    future.set_exception(error)
            else:
                if future is not None:
                    future.set_result(result)

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                self._wakeup.clear()
                self._run_commands()
                if engine.has_unfinished_requests() and not engine.is_sleeping:
                    self._deliver(engine.step())
                else:
                    self._wakeup.wait(timeout=1.0)
        except BaseException as error:  # the engine is dead: tell every waiting stream
            logger.exception("the engine loop failed")
            self.dead_error = error
            with self._streams_lock:
                streams, self._streams = list(self._streams.values()), {}
            dead = EngineDeadError(f"the engine has stopped: {error!r}")
            for stream in streams:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, dead)
            self._fail_pending_commands(dead)

    def _fail_pending_commands(self, error: BaseException) -> None:
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(error)

    def _deliver(self, outputs: Sequence[RequestOutput | PoolingRequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        with self._streams_lock:
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if stream is None:
                    continue
                if output.finished:
                    del self._streams[output.request_id]
                by_loop.setdefault(stream.loop, []).append((stream.queue, output))
        for loop, items in by_loop.items():
            # RuntimeError: that event loop is closed; nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_put_all, items)

    # -- requests ------------------------------------------------------------------------------

    async def _open(self, request_id: str, add: Callable[[], Any]) -> _Stream:
        self._check_alive()
        stream = _Stream(asyncio.get_running_loop())
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
        try:
            await self._call(add)
        except BaseException:
            with self._streams_lock:
                self._streams.pop(request_id, None)
            raise
        return stream

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come (cumulative, delta or final, per
        ``params.output_kind``). Closing the iterator early aborts the request."""
        stream = await self._open(
            request_id, lambda: self.engine.add_request(request_id, prompt, params, priority=priority)
        )
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._abort_soon(request_id)

    async def encode(self, prompt: str | list[int], request_id: str) -> PoolingRequestOutput:
        """The embedding of one prompt (an embedding model)."""
        stream = await self._open(request_id, lambda: self.engine.add_request(request_id, prompt))
        finished = False
        try:
            item = await stream.queue.get()
            if isinstance(item, BaseException):
                raise item
            finished = True
            return item
        finally:
            if not finished:
                self._abort_soon(request_id)

    def _abort_soon(self, request_id: str) -> None:
        with self._streams_lock:
            self._streams.pop(request_id, None)
        if self.dead_error is None and self._thread.is_alive():
            self._submit(lambda: self.engine.abort_request([request_id]), wait=False)

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """Abort requests at any point; their KV blocks are freed at once and their streams end
        with a final output whose finish reason is ``abort``."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self.dead_error is not None:
            return
        await self._call(lambda: self._deliver(self.engine.abort_request(ids)))

    # -- maintenance ---------------------------------------------------------------------------

    async def reset_prefix_cache(self) -> bool:
        return await self._call(self.engine.reset_prefix_cache)

    async def sleep(self, level: int = 1) -> None:
        await self._call(lambda: self.engine.sleep(level))

    async def wake_up(self) -> None:
        await self._call(self.engine.wake_up)

    async def check_health(self) -> None:
        self._check_alive()

    async def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def shutdown(self) -> None:
        """Stop the engine thread; open streams end with EngineDeadError."""
        if self._stopping:
            return
        self._stopping = True
        self._wakeup.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)
        with self._streams_lock:
            streams, self._streams = list(self._streams.values()), {}
        error = EngineDeadError("the engine was shut down")
        for stream in streams:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)
        self._fail_pending_commands(error)


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for target, item in items:
        target.put_nowait(item)
