"""A keyed work queue (client-go's workqueue, for asyncio): each key is handled by one worker at
a time, a key added while queued is queued once, one added while being handled is handled again
afterwards, and a key may be added after a delay (retries with backoff, bursts coalesced)."""

import asyncio
from collections.abc import Hashable


class WorkQueue:
    def __init__(self) -> None:
        self._ready: asyncio.Queue[Hashable] = asyncio.Queue()
        self._queued: set[Hashable] = set()
        self._active: set[Hashable] = set()
        self._again: set[Hashable] = set()
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}

    def add(self, key: Hashable, delay: float = 0.0) -> None:
        if delay > 0:
            loop = asyncio.get_running_loop()
            timer = self._timers.get(key)
            due = loop.time() + delay
            if timer is not None and timer.when() <= due:
                return  # an earlier add will handle it
            if timer is not None:
                timer.cancel()
            self._timers[key] = loop.call_at(due, self._fire, key)
            return
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> Hashable:
        key = await self._ready.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: Hashable) -> None:
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def forget(self, key: Hashable) -> None:
        """Drop a pending delayed add (the object is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def __len__(self) -> int:
        return len(self._queued) + len(self._timers)
