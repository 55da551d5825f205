"""Request preparation off the event loop. Tokenizing a 10 MB prompt or rendering a chat
template takes seconds; on the loop it would stall every other request and the probes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# A few threads: one huge prompt does not hold up the small ones behind it, and the tokenizer
# (Rust, GIL released while it encodes) is safe to share when no call changes its truncation.
PREPARE_THREADS = 4

_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="prepare")
    return _executor


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the preparation threads; the loop serves other requests meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args))
