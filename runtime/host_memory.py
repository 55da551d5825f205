"""Handing freed heap memory back to the operating system.

glibc's malloc keeps freed chunks in its heaps for reuse unless they sit at a heap's top (large
tensors too, once its mmap threshold has grown), so a process that freed a lot keeps it resident.
``malloc_trim(0)`` returns the free pages of every heap. The API process calls it after large
request bodies (server/memory.py), the worker after loading weights and after a sleep."""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


malloc_trim = _find_malloc_trim()


def release_free_memory() -> None:
    """Return the C heaps' free pages to the operating system (a no-op without glibc)."""
    if malloc_trim is not None:
        malloc_trim(0)
