"""Async plumbing of the routes: merging per-prompt output streams, Server-Sent Events framing,
and cancelling a request's work when its client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request
from infernetes.runtime.server.errors import APIError

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    """One SSE event; pydantic models are dumped without their unset defaults' Nones."""
    if hasattr(payload, "model_dump_json"):
        return b"data: " + payload.model_dump_json(exclude_none=True).encode() + b"\n\n"
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, proxies see traffic


async def keep_alive(events: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """``events``, with a keep-alive comment whenever none came for ``interval`` seconds
    (--sse-keep-alive-interval; 0: never)."""
    if interval <= 0:
        async for event in events:
            yield event
        return
    pending = asyncio.ensure_future(anext(events))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEP_ALIVE
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
            pending = asyncio.ensure_future(anext(events))
    finally:
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def merge(iterators: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several async iterators as they come, tagged with the iterator's index."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    finished = object()

    async def pump(index: int, iterator: AsyncIterator[T]) -> None:
        try:
            async for item in iterator:
                await queue.put((index, item))
        except BaseException as exc:  # handed to the consumer, which re-raises
            await queue.put((index, exc))
        finally:
            await queue.put((index, finished))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is finished:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs ``work``; if the client disconnects first, cancels it (its finally blocks abort the
    engine requests) and answers 499 to nobody."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


async def engine_stream(stream: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """Yields from an engine output stream and always closes it, so a request whose client went
    away (or that failed) is aborted in the engine at once, not when the GC gets to it. Engine
    errors become API errors: bad input (ValueError) 400, a dead engine 503."""
    try:
        async for item in stream:
            yield item
    except (ValueError, TypeError) as exc:
        raise APIError(str(exc), 400, getattr(exc, "param", None)) from exc
    except RuntimeError as exc:  # EngineDeadError and the like
        raise APIError(f"the engine cannot serve this request: {exc}", 503) from exc
    finally:
        await stream.aclose()
