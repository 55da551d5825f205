"""The waiting requests, in the order ``--scheduling-policy`` serves them: arrival (``fcfs``) or
priority, then arrival (``priority``). A preempted request goes back to the front (fcfs) or by
its own priority."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from infernetes.runtime.engine.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._items: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._items.append(request)

    def add_front(self, request: Request) -> None:
        self._items.appendleft(request)

    def peek(self) -> Request:
        return self._items[0]

    def pop(self) -> Request:
        return self._items.popleft()

    def remove(self, request: Request) -> None:
        self._items.remove(request)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, int], Request]] = []

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.sort_key, request))

    add_front = add  # a preempted request goes back by its own priority

    def peek(self) -> Request:
        return self._heap[0][1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def remove(self, request: Request) -> None:
        self._heap = [item for item in self._heap if item[1] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (item[1] for item in self._heap)
