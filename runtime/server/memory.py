"""Handing the memory a large request used back to the operating system.

Tokenizing a 10 MB prompt allocates about a gigabyte in small pieces (the tokenizer's encoding of
four million tokens: ids, offsets, token strings, and the Python list of ids) and frees it when the
request ends. glibc's malloc keeps freed memory in its heaps unless it sits at a heap's top, so
the API process stayed ~0.9 GB larger after one such prompt, for good. ``malloc_trim(0)`` returns
the free pages of every heap, in a worker thread: a few milliseconds, 0.2 s for 1.5 GB. It runs
after each request whose body was 128 KiB or more: the memory a prompt leaves behind is about
100 times its size, so smaller bodies leave at most ~15 MB, and trimming after each of them would
only cost time.
"""

from __future__ import annotations

import asyncio

from infernetes.runtime.host_memory import release_free_memory
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LARGE_BODY_BYTES = 128 << 10


class ReleaseMemoryMiddleware:
    """After a request whose body was at least ``threshold`` bytes, ``release_free_memory``."""

    def __init__(self, app: ASGIApp, threshold: int = LARGE_BODY_BYTES) -> None:
        self.app = app
        self.threshold = threshold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counting_receive, send)
        finally:
            if received >= self.threshold:
                await asyncio.to_thread(release_free_memory)
