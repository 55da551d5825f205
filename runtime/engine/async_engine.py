"""AsyncEngine: the asyncio front of the engine core.

The core (``engine_core.EngineCore`` served by ``core_loop.CoreLoop``) runs in a process of its own by default
(``VLLM_ENABLE_V1_MULTIPROCESSING``, as in vLLM V1) or in a thread of this process
(``core_client``). This side prepares each request (``input_processor``: tokenized and checked
before it crosses, so a bad one never reaches a core), keeps one asyncio queue per request
stream, sends commands (add, abort, maintenance calls) and turns the core's messages back into
stream items: each step's outputs go to their streams' event loops in one callback per loop, its
statistics to the stat loggers, replies to the awaiting calls. When the core dies, every open stream gets the error,
``errored`` turns true and ``dead_error`` says why.

With ``--data-parallel-size N`` there are N cores, each with its own devices; a new request goes
to the one with the fewest open streams (its running and waiting requests, as this side counts
them), an abort to the one that holds the request, a maintenance call to all; each core's
statistics carry its index (``SchedulerStats.engine_index``), and one dead core fails the engine.

A hung core counts as dead, so probes fail instead of requests hanging: while requests are in
flight the core speaks after every step, and silence longer than VLLM_ENGINE_ITERATION_TIMEOUT_S
means a step is stuck (a watchdog thread checks); a maintenance call (sleep, wake_up,
reset_prefix_cache) unanswered after VLLM_RPC_TIMEOUT milliseconds means the core is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from infernetes.runtime.engine.input_processor import InputProcessor, Prompt
from infernetes.runtime.engine.messages import (
    AbortRequests,
    AddRequest,
    EngineCoreRequest,
    EngineDead,
    EngineMessage,
    StepOutputs,
    UtilityCall,
    UtilityReply,
)
from infernetes.runtime.engine.stats import IterationStats, StatLogger
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.outputs import PoolingRequestOutput, RequestOutput
from infernetes.runtime.sampling_params import RequestOutputKind, SamplingParams
from infernetes.runtime.tracing import request_tracer, trace_headers

from infernetes.schema.config import ServeConfig
from infernetes.schema.env import read_env

if TYPE_CHECKING:
    from infernetes.runtime.engine.shared_core import SharedCoreLink

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine core stopped after an error; no request can be served any more."""


class _Stream:
    __slots__ = ("core", "loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop, core: int) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.core = core  # the index of the engine core that serves it


class AsyncEngine:
    def __init__(
        self,
        config: ServeConfig,
        stat_loggers: Sequence[StatLogger] = (),
        multiprocess: bool = False,
        core_link: SharedCoreLink | None = None,
    ) -> None:
        self.stat_loggers = list(stat_loggers)
        names = config.served_model_name or [config.model]
        self.tracer = request_tracer(config, names[0])
        if self.tracer is not None:
            self.stat_loggers.append(self.tracer)
        self.dead_error: BaseException | None = None
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._stopping = False
        self._sleeping = False
        self._iteration_timeout_s: int = read_env("VLLM_ENGINE_ITERATION_TIMEOUT_S")
        self._rpc_timeout_ms: int = read_env("VLLM_RPC_TIMEOUT")
        size = config.data_parallel_size
        # Per core: when it last spoke (or last got work while idle), and its open streams.
        self._last_heard = [time.monotonic()] * size
        self._load = [0] * size
        self.cores = (
            _start_cores(config, multiprocess, self._on_message)
            if core_link is None
            else [_link_core(core_link, self._on_message)]
        )
        # The first EngineCore itself when it runs in this process (tests reach into it).
        self.engine = getattr(self.cores[0], "engine", None)
        info = self.cores[0].info
        # Requests are prepared here, off the cores' loops (every core runs the same model).
        self.input_processor = InputProcessor(info.inputs, info.tokenizer, info.mm_processor)
        self.tokenizer = info.tokenizer
        # what stands for an item of each modality in a prompt's text (None: text only)
        self.media_placeholders = (
            None if info.mm_processor is None else info.mm_processor.placeholders
        )
        self.max_model_len = info.inputs.max_model_len
        self.model_config = info.model_config
        self.is_pooling = info.inputs.is_pooling
        self.device = info.device  # "cuda" or "cpu"
        self.default_sampling_params = info.inputs.default_sampling_params
        self._watchdog = threading.Thread(
            target=self._watch_steps, name="infernetes-engine-watchdog", daemon=True
        )
        self._watchdog.start()

    @classmethod
    def from_config(
        cls,
        config: ServeConfig,
        stat_loggers: Sequence[StatLogger] = (),
        multiprocess: bool = False,
        core_link: SharedCoreLink | None = None,
    ) -> AsyncEngine:
        """Load the model and start serving: the core in its own process when ``multiprocess``
        (what the server does, per VLLM_ENABLE_V1_MULTIPROCESSING; see ``core_process_enabled``),
        else in a thread of this one; with ``core_link``, the core another process started and
        shares among the API processes (``--api-server-count``)."""
        return cls(config, stat_loggers, multiprocess, core_link)

    # -- state ---------------------------------------------------------------------------------

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    @property
    def is_running(self) -> bool:
        alive = all(core.alive for core in self.cores)
        return alive and not self.errored and not self._stopping

    @property
    def is_sleeping(self) -> bool:
        return self._sleeping

    def _check_alive(self) -> None:
        if self.dead_error is not None:
            raise EngineDeadError(
                f"the engine has stopped: {self.dead_error!r}"
            ) from self.dead_error
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")

    # -- messages from the core (on the core's thread or the pipe reader's) ---------------------

    def _on_message(self, message: EngineMessage, core: int = 0) -> None:
        self._last_heard[core] = time.monotonic()
        match message:
            case StepOutputs(outputs=outputs, stats=stats):
                if outputs:
                    self._deliver(outputs)
                for scheduler_stats, iteration_stats in stats:
                    self._record(scheduler_stats, self._with_mm_cache_stats(iteration_stats))
            case UtilityReply(call_id=call_id, ok=ok, value=value):
                future = self._calls.pop(call_id, None)
                if future is not None and not future.done():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
            case EngineDead(error=error) if self.dead_error is None:
                logger.error("the engine core died: %r", error)
                self.dead_error = error
                self._fail_all(EngineDeadError(f"the engine has stopped: {error!r}"))

    def _watch_steps(self) -> None:
        """Fails the engine when it has had requests in flight and said nothing for longer than
        VLLM_ENGINE_ITERATION_TIMEOUT_S (a sleeping engine steps no more, so it is left alone)."""
        limit = self._iteration_timeout_s
        while self.dead_error is None and not self._stopping:
            time.sleep(min(1.0, limit / 4))
            busy = [c for c, load in enumerate(self._load) if load]
            silent = max((time.monotonic() - self._last_heard[c] for c in busy), default=0.0)
            if busy and not self._sleeping and silent > limit:
                self._on_message(
                    EngineDead(
                        TimeoutError(
                            f"an engine step took longer than VLLM_ENGINE_ITERATION_TIMEOUT_S={limit} s "
                            f"(the engine core has sent nothing for {silent:.1f} s with requests in flight)"
                        )
                    )
                )

    def _with_mm_cache_stats(self, iteration_stats: IterationStats | None) -> Any:
        """The step's stats with the processor cache's lookups since the last step: the cache
        is on this side of the pipe."""
        processor = self.input_processor.mm_processor
        cache = processor.cache if processor is not None else None
        if cache is None or iteration_stats is None:
            return iteration_stats
        return dataclasses.replace(iteration_stats, mm_cache_stats=cache.take_stats())

    def _record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(scheduler_stats, iteration_stats)
            except Exception:  # a broken logger must not stop serving
                logger.exception("stat logger %r failed", stat_logger)

    def _deliver(self, outputs: Sequence[RequestOutput | PoolingRequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        with self._streams_lock:
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if stream is None:
                    continue
                if output.finished:
                    del self._streams[output.request_id]
                    self._load[stream.core] -= 1
                by_loop.setdefault(stream.loop, []).append((stream.queue, output))
        for loop, items in by_loop.items():
            # RuntimeError: that event loop is closed; nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_put_all, items)

    def _fail_all(self, error: BaseException) -> None:
        with self._streams_lock:
            streams, self._streams = list(self._streams.values()), {}
            self._load = [0] * len(self.cores)
        for stream in streams:
            with contextlib.suppress(RuntimeError):
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)
        calls, self._calls = list(self._calls.values()), {}
        for future in calls:
            if not future.done():
                future.set_exception(error)

    # -- commands to the core ------------------------------------------------------------------

    async def _call(
        self, command: Callable[[int], AddRequest | AbortRequests | UtilityCall], core: int = 0
    ) -> Any:
        """Send ``command(call_id)`` to core ``core`` and await its reply; a utility call
        unanswered within VLLM_RPC_TIMEOUT fails the engine (the core is hung; its state is
        unknown from now on)."""
        self._check_alive()
        call_id = next(self._call_ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls[call_id] = future
        sent = command(call_id)
        try:
            self.cores[core].send(sent)
        except OSError as error:  # the pipe is gone: the reader reports the death
            self._calls.pop(call_id, None)
            raise EngineDeadError(f"the engine has stopped: {error!r}") from error
        if self.dead_error is not None:  # died between the check and the registration
            self._calls.pop(call_id, None)
            self._check_alive()
        if not isinstance(sent, UtilityCall):  # adds and aborts wait behind a step (watchdog)
            return await asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self._rpc_timeout_ms / 1000)
        except TimeoutError:
            self._calls.pop(call_id, None)
            hung = TimeoutError(
                f"the engine core did not answer {sent.method} within VLLM_RPC_TIMEOUT={self._rpc_timeout_ms} ms"
            )
            self._on_message(EngineDead(hung))
            raise EngineDeadError(f"the engine has stopped: {hung!r}") from hung

    async def _open(self, request: EngineCoreRequest) -> _Stream:
        request_id = request.request_id
        self._check_alive()
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            core = min(range(len(self.cores)), key=self._load.__getitem__)  # the least loaded
            if not self._load[core]:  # an idle core owes no step yet: the watchdog's clock starts
                self._last_heard[core] = time.monotonic()
            stream = self._streams[request_id] = _Stream(asyncio.get_running_loop(), core)
            self._load[core] += 1
        try:
            await self._call(lambda call_id: AddRequest(call_id, request), core)
        except asyncio.CancelledError:
            # The client left while the request was being queued: it may be queued by now.
            self._abort_soon(request_id)
            raise
        except BaseException:
            self._close_stream(request_id)
            raise
        return stream

    def _close_stream(self, request_id: str) -> _Stream | None:
        with self._streams_lock:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                self._load[stream.core] -= 1
        return stream

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Outputs of one request as they come (cumulative, delta or final, per
        ``params.output_kind``), with the adapter ``lora_request`` if given. Closing the
        iterator early aborts the request."""
        self._begin_trace(request_id, params)
        stream = await self._open(
            self.input_processor.process(
                request_id, prompt, params, priority, lora_request=lora_request
            )
        )
        delta = params.output_kind == RequestOutputKind.DELTA
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                # A consumer that fell behind (many streams on one event loop) takes what is
                # queued as one output, as vLLM's does: fewer, larger chunks, never a backlog.
                while not item.finished and not stream.queue.empty():
                    later = stream.queue.get_nowait()
                    if isinstance(later, BaseException):
                        stream.queue.put_nowait(later)  # raised on the next read
                        break
                    item = item.followed_by(later, delta)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._abort_soon(request_id)

    async def encode(self, prompt: str | list[int], request_id: str) -> PoolingRequestOutput:
        """The embedding of one prompt (an embedding model)."""
        self._begin_trace(request_id, None)
        stream = await self._open(self.input_processor.process(request_id, prompt, None))
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

    def _begin_trace(self, request_id: str, params: SamplingParams | None) -> None:
        if self.tracer is not None:
            self.tracer.begin(request_id, params)
        elif trace_headers.get() is not None:
            _warn_untraced()

    def _abort_soon(self, request_id: str) -> None:
        stream = self._close_stream(request_id)
        if stream is not None and self.dead_error is None and not self._stopping:
            with contextlib.suppress(OSError):
                self.cores[stream.core].send(AbortRequests(None, [request_id]))

    def request_ids(self) -> list[str]:
        """Ids of the requests whose output streams are open (what a server shutdown aborts)."""
        with self._streams_lock:
            return list(self._streams)

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """Abort requests at any point; their KV blocks are freed at once and their streams end
        with a final output whose finish reason is ``abort``."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self.dead_error is not None:
            return
        by_core: dict[int, list[str]] = {}
        with self._streams_lock:
            for rid in ids:
                stream = self._streams.get(rid)
                if stream is not None:  # no stream: it has finished already
                    by_core.setdefault(stream.core, []).append(rid)
        await asyncio.gather(
            *(
                self._call(functools.partial(AbortRequests, request_ids=held), core)
                for core, held in by_core.items()
            )
        )

    # -- maintenance ---------------------------------------------------------------------------

    async def _call_all(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """A maintenance call on every core; their results in core order."""
        return await asyncio.gather(
            *(
                self._call(lambda call_id: UtilityCall(call_id, method, args), core)
                for core in range(len(self.cores))
            )
        )

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter on every core; a ValueError names what is wrong with it."""
        return all(await self._call_all("add_lora", (lora_request,)))

    async def remove_lora(self, lora_int_id: int) -> bool:
        return any(await self._call_all("remove_lora", (lora_int_id,)))

    async def list_loras(self) -> set[int]:
        return set().union(*await self._call_all("list_loras"))

    async def reset_prefix_cache(self) -> bool:
        return all(await self._call_all("reset_prefix_cache"))

    async def sleep(self, level: int = 1) -> None:
        await self._call_all("sleep", (level,))
        self._sleeping = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self._sleeping = any(await self._call_all("wake_up", (tags,)))

    async def reload_weights(self) -> None:
        await self._call_all("reload_weights")

    async def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """Every core's workers' results, core by core."""
        per_core = await self._call_all("collective_rpc", (method, tuple(args), kwargs))
        return [result for results in per_core for result in results]

    async def check_health(self) -> None:
        self._check_alive()

    async def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def shutdown(self) -> None:
        """Stop the engine core; open streams end with EngineDeadError."""
        if self._stopping:
            return
        self._stopping = True
        hung = isinstance(self.dead_error, TimeoutError)  # a missed step or RPC deadline
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, core.stop, hung) for core in self.cores))
        self._fail_all(EngineDeadError("the engine was shut down"))
        if self.tracer is not None:
            self.tracer.shutdown()  # exports what is queued, within the SDK's timeout


def _start_cores(
    config: ServeConfig, multiprocess: bool, on_message: Callable[[EngineMessage, int], None]
) -> list[Any]:
    """The ``--data-parallel-size`` engine cores, loading side by side; if one fails to load,
    the others are stopped and its error raised."""
    from infernetes.runtime.engine.core_client import CoreProcess, CoreThread

    client: type[CoreProcess] | type[CoreThread] = CoreProcess if multiprocess else CoreThread
    size = config.data_parallel_size
    if size > 1 and not multiprocess:  # one model a process (process groups, backend)
        raise ValueError(
            "data_parallel_size above 1 needs each engine core in a process of its own "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=1, the default)"
        )
    with concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="infernetes-load") as pool:
        futures: list[concurrent.futures.Future[CoreProcess | CoreThread]] = [
            pool.submit(client, config, functools.partial(_tagged, on_message, rank), rank)
            for rank in range(size)
        ]
        concurrent.futures.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for future in futures:
            if future.exception() is None:
                future.result().stop()
        raise failed[0]  # type: ignore[misc]
    return [future.result() for future in futures]


def _link_core(link: SharedCoreLink, on_message: Callable[[EngineMessage, int], None]) -> Any:
    from infernetes.runtime.engine.shared_core import SharedCoreClient

    return SharedCoreClient(link, functools.partial(_tagged, on_message, 0))


def _tagged(
    on_message: Callable[[EngineMessage, int], None], core: int, message: EngineMessage
) -> None:
    on_message(message, core)


@functools.cache
def _warn_untraced() -> None:
    logger.warning(
        "a request carries a trace context (traceparent) but tracing is off: "
        "set --otlp-traces-endpoint to export request traces"
    )


def core_process_enabled() -> bool:
    """VLLM_ENABLE_V1_MULTIPROCESSING: whether a server runs the engine core in its own process."""
    return bool(read_env("VLLM_ENABLE_V1_MULTIPROCESSING"))


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for target, item in items:
        target.put_nowait(item)
