"""Scheduler: owns every request's state, from queued to finished.

There is no prefill phase and no decode phase: each request simply has tokens it still has to
compute (``num_tokens - num_computed_tokens``), one for a decode, the rest of the prompt (or a
chunk of it) for a prefill, and each step gives some of them to as many requests as the token
budget, ``max_num_seqs`` and the KV cache allow. ``schedule()`` decides a step; the workers run
it; ``update_from_output()`` appends the sampled tokens, checks the stop conditions and finishes
requests (their blocks freed at once). When the KV cache runs out, the lowest-priority running
request is preempted: its blocks are freed and it is recomputed later.

Under pipeline parallelism several steps are in flight at once (the engine core's batch queue):
a request in a step whose output has not come back is not scheduled again, nor preempted, and
its sampled tokens travel to the earlier stages in the next step that computes them.

Under async scheduling (vLLM V1's) the next step is scheduled while the workers run this one, and
the same running requests go into it before their last token is known: ``schedule()`` advances
``num_computed_tokens`` at once and counts the token each sampling row will bring as a placeholder
(``Request.num_output_placeholders``); the worker feeds that token from its own state, and
``update_from_output()`` appends it later. So the stop checks see a token one step late: a request
that has finished may have one more step in flight, whose token is dropped. A step's output is
matched to the very requests it was scheduled with (``step_id``), so a request that ended, was
preempted, or whose id came back for a new request, takes nothing from it.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from infernetes.runtime.config import SchedulerConfig
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.scheduler_output import (
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from infernetes.runtime.engine.stats import (
    FinishedRequestStats,
    IterationStats,
    PrefixCacheStats,
    SchedulerStats,
    finished_request_stats,
)
from infernetes.runtime.engine.stop_checker import check_stop
from infernetes.runtime.model_executor.sampler import SampledToken


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

    def __iter__(self) -> Iterator[Request]:
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

    def __iter__(self) -> Iterator[Request]:
        return (item[1] for item in self._heap)


@dataclass
class _StepBudget:
    """What is left of one step while it is being scheduled."""

    tokens: int
    partial_prefills: int = 0  # prefills that will not finish this step
    long_partial_prefills: int = 0


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, *, pipelined: bool = False
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.pipelined = pipelined  # the workers of the earlier stages need the sampled tokens
        self.async_scheduling = config.async_scheduling
        # Pipelined: scheduled in a step whose output has not come back (not scheduled again).
        self.in_flight: set[str] = set()
        self._steps: dict[int, list[Request]] = {}  # the requests of each step not yet updated
        self._next_step_id = 0
        self.waiting: _FCFSQueue | _PriorityQueue = (
            _PriorityQueue() if config.policy == "priority" else _FCFSQueue()
        )
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_preemptions_step = 0
        # Requests that ended since the last step: the workers drop their state.
        self._finished_req_ids: set[str] = set()
        self._finished_stats: list[FinishedRequestStats] = []  # not yet reported

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
        self._finished_req_ids.add(request.request_id)
        self._finished_stats.append(finished_request_stats(request))

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

    def take_finished_stats(self) -> list[FinishedRequestStats]:
        taken, self._finished_stats = self._finished_stats, []
        return taken

    def make_stats(self, kv_cache_usage: float) -> SchedulerStats:
        return SchedulerStats(
            num_running_reqs=self.num_running,
            num_waiting_reqs=self.num_waiting,
            kv_cache_usage=kv_cache_usage,
            prefix_cache_stats=self.prefix_cache_stats.take(),
            num_preemptions=self.num_preemptions_step,
            running_lora_adapters=_count_adapters(self.running),
            waiting_lora_adapters=_count_adapters(self.waiting),
        )

    # -- scheduling ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = _StepBudget(self.config.max_num_batched_tokens)
        self.num_preemptions_step = 0
        # First, the RUNNING requests, in order, preempting the last to arrive when blocks run out.
        self._schedule_running(output, budget)
        # Next, the WAITING requests (new or preempted), only when nothing had to be preempted.
        if not self.num_preemptions_step:
            self._schedule_waiting(output, budget)
        output.finished_req_ids, self._finished_req_ids = self._finished_req_ids, set()
        if output:
            self._register_step(output)
        return output

    def _register_step(self, output: SchedulerOutput) -> None:
        """Number the step and remember its requests; under async scheduling, advance them past
        it now, a placeholder for each token it will sample."""
        output.step_id = self._next_step_id
        self._next_step_id += 1
        requests = [self.requests[request_id] for request_id in output.request_ids]
        self._steps[output.step_id] = requests
        if self.pipelined:
            self.in_flight.update(output.request_ids)
        if not self.async_scheduling:
            return
        for request, num_new in zip(requests, output.num_scheduled_tokens, strict=True):
            end = request.num_computed_tokens + num_new
            if not request.pooling and end == request.num_tokens + request.num_output_placeholders:
                request.num_output_placeholders += 1
            request.num_computed_tokens = end

    def _schedule_running(self, output: SchedulerOutput, budget: _StepBudget) -> None:
        i = 0
        while i < len(self.running) and budget.tokens > 0:
            request = self.running[i]
            if request.request_id in self.in_flight:
                i += 1
                continue
            remaining = self._remaining(request)
            if remaining <= 0:  # async: what it still needs is in flight already
                i += 1
                continue
            num_new = self._prefill_chunk(remaining, budget.tokens)
            num_blocks_before = len(request.block_ids)
            while not self.block_manager.allocate_slots(request, num_new):
                victim = self._pick_victim(i)
                self.running.remove(victim)
                self._preempt(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted itself; self.running[i] is now the next request
            self._count_partial(budget, remaining, num_new)
            data = CachedRequestData(
                request.request_id,
                request.block_ids[num_blocks_before:],
                request.num_computed_tokens,
                new_token_ids=self._sampled_tokens(request, num_new),
            )
            output.add(data, num_new)
            budget.tokens -= num_new
            i += 1

    def _schedule_waiting(self, output: SchedulerOutput, budget: _StepBudget) -> None:
        skipped: list[Request] = []
        while (
            len(self.waiting) and budget.tokens > 0 and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            cached: list[int] = []
            if request.num_computed_tokens == 0 and not _wants_prompt_logprobs(request):
                cached = self.block_manager.find_cached_prefix(request)
            remaining = request.num_tokens - len(cached) * self.block_manager.block_size
            if not self.config.enable_chunked_prefill and remaining > budget.tokens:
                break
            if not self._lora_fits(request):
                skipped.append(self.waiting.pop())  # its adapter would be one too many
                continue
            chunk = self._prefill_chunk(remaining, budget.tokens)
            if chunk < remaining and not self._may_start_partial(budget, remaining):
                # Another partial prefill is not allowed: let a shorter request go instead.
                skipped.append(self.waiting.pop())
                continue
            if not self.block_manager.allocate_slots(request, chunk, cached):
                break
            self.waiting.pop()
            output.add(self._admit(request, len(cached) * self.block_manager.block_size), chunk)
            self._count_partial(budget, remaining, chunk)
            budget.tokens -= chunk
        for request in reversed(skipped):
            self.waiting.add_front(request)

    def _remaining(self, request: Request) -> int:
        """Tokens a running request may compute next: those not computed yet, counting the
        tokens its steps in flight will sample (async scheduling), but none for a request that
        is sure to end when those arrive (its token would be thrown away)."""
        placeholders = request.num_output_placeholders
        if placeholders and self._ends_with_placeholders(request):
            return 0
        return request.num_tokens + placeholders - request.num_computed_tokens

    def _ends_with_placeholders(self, request: Request) -> bool:
        """Whether the tokens in flight bring ``request`` to its length limit."""
        params = request.sampling_params
        placeholders = request.num_output_placeholders
        if request.num_tokens + placeholders >= self.config.max_model_len:
            return True
        return (
            params is not None
            and params.max_tokens is not None
            and request.num_output_tokens + placeholders >= params.max_tokens
        )

    def _sampled_tokens(self, request: Request, num_new: int) -> list[int]:
        """The sampled tokens among those ``request`` computes next, for the earlier stages."""
        if not self.pipelined:
            return []
        start = max(request.num_computed_tokens, request.num_prompt_tokens)
        return request.token_ids[start : request.num_computed_tokens + num_new]

    def _lora_fits(self, request: Request) -> bool:
        """Whether ``request`` may run beside the running requests: their distinct adapters stay
        within ``--max-loras`` (the workers' device slots)."""
        lora = request.lora_request
        if lora is None:
            return True
        running = {r.lora_request.lora_int_id for r in self.running if r.lora_request}
        return lora.lora_int_id in running or len(running) < self.config.max_loras

    def _admit(
        self, request: Request, num_cached_tokens: int
    ) -> NewRequestData | CachedRequestData:
        """Move ``request`` (its blocks allocated) from the queue to the running requests; what
        the workers need to know of it: all of it the first time, its blocks after a preemption."""
        data: NewRequestData | CachedRequestData
        if request.times.scheduled is None:
            data = NewRequestData(
                request.request_id,
                list(request.token_ids),
                request.num_prompt_tokens,
                request.sampling_params,
                request.eos_token_id,
                list(request.block_ids),
                request.num_computed_tokens,
                request.lora_request,
                request.prompt_embeds,
            )
        else:
            data = CachedRequestData(
                request.request_id,
                list(request.block_ids),
                request.num_computed_tokens,
                resumed_from_preemption=True,
                new_token_ids=self._sampled_tokens(request, request.num_tokens),
                num_tokens=request.num_tokens if self.async_scheduling else None,
            )
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_cached_tokens
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_cached_tokens
        request.status = RequestStatus.RUNNING
        if request.times.scheduled is None:
            request.times.scheduled = time.monotonic()
        self.running.append(request)
        return data

    # -- the long-prefill rule, in one place ---------------------------------------------------

    @property
    def _threshold(self) -> int:
        """The cap on one prefill chunk; only with chunked prefill (0: no cap)."""
        config = self.config
        return config.long_prefill_token_threshold if config.enable_chunked_prefill else 0

    def _is_long(self, remaining: int) -> bool:
        return 0 < self._threshold < remaining

    def _prefill_chunk(self, remaining: int, budget: int) -> int:
        """Tokens a request with ``remaining`` to compute gets: capped by the long-prefill
        threshold and by the budget."""
        if self._is_long(remaining):
            remaining = self._threshold
        return min(remaining, budget)

    def _may_start_partial(self, budget: _StepBudget, remaining: int) -> bool:
        """Whether one more prefill may stop short of its end this step."""
        if budget.partial_prefills >= self.config.max_num_partial_prefills:
            return False
        return not (
            self._is_long(remaining)
            and budget.long_partial_prefills >= self.config.max_long_partial_prefills
        )

    def _count_partial(self, budget: _StepBudget, remaining: int, num_new: int) -> None:
        if num_new < remaining:
            budget.partial_prefills += 1
            budget.long_partial_prefills += self._is_long(remaining)

    # -- preemption ----------------------------------------------------------------------------

    def _preempt(self, request: Request) -> None:
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0  # a step in flight for it is discarded
        self.num_preemptions_step += 1
        self.waiting.add_front(request)

    def _pick_victim(self, first_unscheduled: int) -> Request:
        """The request to preempt: among those not yet scheduled this step (the current one
        included), the last to arrive (fcfs) or the lowest priority."""
        candidates = [
            r for r in self.running[first_unscheduled:] if r.request_id not in self.in_flight
        ]
        if self.config.policy == "priority":
            return max(candidates, key=lambda r: r.sort_key)
        return candidates[-1]

    # -- after the step ------------------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput
    ) -> tuple[list[Request], IterationStats]:
        """Advance each scheduled request past this step's tokens, append its sampled token, check
        its stop conditions, finish it if done. Returns the requests with something new (a token,
        prompt logprobs, an embedding, an end) in batch order, and the step's statistics."""
        iteration = IterationStats()
        updated: list[Request] = []
        now = time.monotonic()
        self.in_flight.difference_update(scheduler_output.request_ids)
        scheduled = self._steps.pop(scheduler_output.step_id, [])
        for i, (request, num_new) in enumerate(
            zip(scheduled, scheduler_output.num_scheduled_tokens, strict=True)
        ):
            if request.status != RequestStatus.RUNNING:
                continue  # ended or preempted since: what this step computed for it is dropped
            if not self.async_scheduling:  # (async: advanced when scheduled)
                request.num_computed_tokens += num_new
            chunk_logprobs = model_output.prompt_logprobs[i]
            if chunk_logprobs is not None and request.prompt_logprobs is not None:
                request.prompt_logprobs.extend(chunk_logprobs)
            if request.pooling:
                pooled = model_output.pooled[i]
                if pooled is not None:
                    request.pooled = pooled
                    self._first_token(request, now, iteration)
                    self.finish_request(request, RequestStatus.FINISHED_STOPPED)
                    updated.append(request)
                continue
            sampled = model_output.sampled[i]
            if sampled is None:
                continue  # a prefill chunk that does not reach the end of the prompt
            request.num_output_placeholders = max(request.num_output_placeholders - 1, 0)
            error = model_output.errors.get(request.request_id)
            self._append_token(request, sampled, error, now, iteration)
            updated.append(request)
        iteration.finished_requests = self.take_finished_stats()
        return updated, iteration

    def _first_token(self, request: Request, now: float, iteration: IterationStats) -> None:
        request.times.first_token = request.times.last_token = now
        iteration.num_prompt_tokens += request.num_prompt_tokens
        iteration.time_to_first_tokens_iter.append(now - request.times.arrival)

    def _append_token(
        self,
        request: Request,
        sampled: SampledToken,
        error: str | None,
        now: float,
        iteration: IterationStats,
    ) -> None:
        request.append_token(sampled.token_id)
        iteration.num_generation_tokens += 1
        last_token = request.times.last_token
        if last_token is None:
            self._first_token(request, now, iteration)
        else:
            iteration.inter_token_latencies_iter.append(now - last_token)
            request.times.last_token = now
        if sampled.logprobs is not None and request.logprobs is not None:
            request.cumulative_logprob += sampled.logprobs.logprob
            request.logprobs.append(sampled.logprobs)
        if error is not None:
            # Its logits processor raised: end this request alone; the batch goes on.
            request.stop_reason = f"error: {error}"
            self.finish_request(request, RequestStatus.FINISHED_ABORTED)
            return
        status, stop_reason = check_stop(request, sampled.token_id, self.config.max_model_len)
        if status is not None:
            request.stop_reason = stop_reason
            self.finish_request(request, status)


def _count_adapters(requests: Iterable[Request]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in requests:
        name = request.lora_name
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _wants_prompt_logprobs(request: Request) -> bool:
    params = request.sampling_params
    return params is not None and params.prompt_logprobs is not None
