"""Scheduler: continuous batching under a token budget, chunked prefill and preemption.

Every step each request is given some of the tokens it still has to compute (``num_tokens -
num_computed_tokens``): one for a decode, the rest of the prompt (or a chunk of it) for a prefill.
Running requests go first, in order; when the KV cache runs out, the lowest-priority running
request is preempted (its blocks freed, recomputed later). Waiting requests join while the budget,
``max_num_seqs`` and the free blocks allow.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.stats import PrefixCacheStats


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    long_prefill_token_threshold: int = 0  # 0: no cap on a prefill chunk
    policy: str = "fcfs"


@dataclass
class ScheduledBatch:
    """What one step computes: each request with the number of new tokens it gets."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.requests)


class _FCFSQueue:
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

    def __iter__(self):
        return iter(self._items)


class _PriorityQueue:
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

    def __iter__(self):
        return (item[1] for item in self._heap)


class Scheduler:
    def __init__(self, limits: SchedulerLimits, block_manager: BlockManager) -> None:
        if limits.policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {limits.policy!r}"
            )
        self.limits = limits
        self.block_manager = block_manager
        self.waiting: _FCFSQueue | _PriorityQueue = (
            _PriorityQueue() if limits.policy == "priority" else _FCFSQueue()
        )
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_preemptions_step = 0

    # -- request lifecycle ---------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        request.times.queued = time.monotonic()
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """End a request in any state; its blocks are freed at once."""
        if request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        request.times.finished = time.monotonic()
        self.block_manager.free(request)
        self.requests.pop(request.request_id, None)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        aborted = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.finish_request(request, RequestStatus.FINISHED_ABORTED)
                aborted.append(request)
        return aborted

    def preempt_all(self) -> None:
        """Free every running request's blocks (they are recomputed later), e.g. before sleeping."""
        for request in reversed(list(self.running)):
            self.running.remove(request)
            self._preempt(request)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    # -- scheduling ----------------------------------------------------------------------------

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_step += 1
        self.waiting.add_front(request)

    def _pick_victim(self, first_unscheduled: int) -> Request:
        """The request to preempt: among those not yet scheduled this step (the current one
        included), the last to arrive (fcfs) or the lowest priority."""
        candidates = self.running[first_unscheduled:]
        if self.limits.policy == "priority":
            return max(candidates, key=lambda r: r.sort_key)
        return candidates[-1]

    @property
    def _threshold(self) -> int:
        """The cap on one prefill chunk; only with chunked prefill (0: no cap)."""
        return self.limits.long_prefill_token_threshold if self.limits.enable_chunked_prefill else 0

    def _chunk(self, request: Request, budget: int) -> int:
        num_new = request.num_tokens - request.num_computed_tokens
        threshold = self._threshold
        if threshold > 0 and num_new > threshold:
            num_new = threshold
        return min(num_new, budget)

    def _is_long(self, request: Request) -> bool:
        threshold = self._threshold
        return threshold > 0 and request.num_tokens - request.num_computed_tokens > threshold

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.limits.max_num_batched_tokens
        self.num_preemptions_step = 0
        partial = 0  # prefills that will not finish this step
        partial_long = 0

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._chunk(request, budget)
            while not self.block_manager.allocate_slots(request, num_new):
                victim = self._pick_victim(i)
                self.running.remove(victim)
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted itself; self.running[i] is now the next request
            if request.num_computed_tokens + num_new < request.num_tokens:
                partial += 1
                partial_long += self._is_long(request)
            batch.requests.append(request)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
            i += 1

        # New and preempted requests join only when nothing had to be preempted this step.
        skipped: list[Request] = []
        while (
            not batch.preempted
            and len(self.waiting)
            and budget > 0
            and len(self.running) < self.limits.max_num_seqs
        ):
            request = self.waiting.peek()
            cached: list[int] = []
            if request.num_computed_tokens == 0 and not self._wants_prompt_logprobs(request):
                cached = self.block_manager.find_cached_prefix(request)
            remaining = request.num_tokens - len(cached) * self.block_manager.block_size
            if not self.limits.enable_chunked_prefill and remaining > budget:
                break
            threshold = self._threshold
            chunk = min(remaining, threshold if threshold > 0 else remaining, budget)
            if chunk < remaining:
                is_long = threshold > 0 and remaining > threshold
                if partial >= self.limits.max_num_partial_prefills or (
                    is_long and partial_long >= self.limits.max_long_partial_prefills
                ):
                    # Another partial prefill is not allowed: let a shorter request go instead.
                    skipped.append(self.waiting.pop())
                    continue
            if not self.block_manager.allocate_slots(request, chunk, cached):
                break
            self.waiting.pop()
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = len(cached) * self.block_manager.block_size
            self.prefix_cache_stats.requests += 1
            self.prefix_cache_stats.queries += request.num_tokens
            self.prefix_cache_stats.hits += len(cached) * self.block_manager.block_size
            if chunk < remaining:
                partial += 1
                partial_long += threshold > 0 and remaining > threshold
            request.status = RequestStatus.RUNNING
            if request.times.scheduled is None:
                request.times.scheduled = time.monotonic()
            self.running.append(request)
            batch.requests.append(request)
            batch.num_new_tokens.append(chunk)
            budget -= chunk
        for request in reversed(skipped):
            self.waiting.add_front(request)
        return batch

    @staticmethod
    def _wants_prompt_logprobs(request: Request) -> bool:
        params = request.sampling_params
        return params is not None and params.prompt_logprobs is not None

    def update_after_step(self, batch: ScheduledBatch) -> None:
        """Advance each scheduled request past the tokens computed this step."""
        for request, num_new in zip(batch.requests, batch.num_new_tokens, strict=True):
            if request.status == RequestStatus.RUNNING:
                request.num_computed_tokens += num_new
