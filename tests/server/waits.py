"""Waiting on other processes without a fixed sleep: poll a condition until it holds or a deadline
passes. The timeouts are ceilings for a loaded machine, never what a test asserts."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

POLL_INTERVAL_S = 0.1


def wait_until(condition: Callable[[], object], timeout: float = 60) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL_INTERVAL_S)
    return False


def gone(process: psutil.Process) -> bool:
    """Whether the process has exited (a zombie its parent has not reaped counts as gone)."""
    return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
