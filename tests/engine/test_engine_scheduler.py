"""Scheduler and BlockManager invariants under random traffic (no model: tokens are made up)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from infernetes.runtime.config import SchedulerConfig
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.scheduler import Scheduler
from infernetes.runtime.engine.scheduler_output import NewRequestData, SchedulerOutput
from infernetes.runtime.model_executor.sampler import SampledToken
from infernetes.runtime.sampling_params import SamplingParams


def _check_invariants(
    scheduler: Scheduler, manager: BlockManager, batch: SchedulerOutput, limits: SchedulerConfig
) -> None:
    assert batch.total_num_scheduled_tokens <= limits.max_num_batched_tokens
    assert len(scheduler.running) <= limits.max_num_seqs
    held: dict[int, int] = {}
    for request in scheduler.running:
        for block_id in request.block_ids[request.num_released_blocks :]:
            held[block_id] = held.get(block_id, 0) + 1
    for block in manager.blocks:
        assert block.ref_count == held.get(block.block_id, 0)
        assert (block.ref_count == 0) == (block.block_id in manager.free_queue)
    for block_hash, block_id in manager.cached.items():
        assert manager.blocks[block_id].block_hash == block_hash
    scheduled = [scheduler.requests[request_id] for request_id in batch.request_ids]
    for request, num_new in zip(scheduled, batch.num_scheduled_tokens, strict=True):
        assert num_new >= 1
        assert len(request.block_ids) * manager.block_size >= request.num_computed_tokens + num_new
        if manager.sliding_window is None:
            assert request.num_released_blocks == 0
        else:  # released blocks lie before every position this step's queries can reach
            released_end = request.num_released_blocks * manager.block_size
            assert released_end <= max(0, request.num_computed_tokens - manager.sliding_window)


class _WorkerView:
    """What a worker knows of each request, built only from the SchedulerOutputs."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def apply(self, batch: SchedulerOutput) -> None:
        for request_id in batch.finished_req_ids:
            self.blocks.pop(request_id, None)
        for data in batch.scheduled_reqs:
            if isinstance(data, NewRequestData):
                assert data.request_id not in self.blocks
                self.blocks[data.request_id] = list(data.block_ids)
            elif data.resumed_from_preemption:
                self.blocks[data.request_id] = list(data.new_block_ids)
            else:
                self.blocks[data.request_id].extend(data.new_block_ids)
            self.computed[data.request_id] = data.num_computed_tokens

    def check(self, scheduler: Scheduler, batch: SchedulerOutput) -> None:
        """The deltas add up to the scheduler's own block tables and computed counts."""
        for request_id in batch.request_ids:
            request = scheduler.requests[request_id]
            assert self.blocks[request_id] == request.block_ids
            assert self.computed[request_id] == request.num_computed_tokens


def _made_up_tokens(
    scheduler: Scheduler, batch: SchedulerOutput, rng: random.Random
) -> ModelRunnerOutput:
    """A token for every request whose prompt (or last token) is computed after this step."""
    output = ModelRunnerOutput.empty(len(batch.scheduled_reqs))
    for i, (request_id, num_new) in enumerate(
        zip(batch.request_ids, batch.num_scheduled_tokens, strict=True)
    ):
        request = scheduler.requests[request_id]
        if request.num_computed_tokens + num_new == request.num_tokens:
            output.sampled[i] = [SampledToken(rng.randrange(50))]
    return output


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([1, 4, 8]),
    budget=st.integers(4, 64),
    max_num_seqs=st.integers(1, 8),
    policy=st.sampled_from(["fcfs", "priority"]),
    caching=st.booleans(),
    threshold=st.sampled_from([0, 3, 10]),
    chunked=st.booleans(),
    window=st.sampled_from([None, 2, 5, 16]),
)
def test_random_traffic_keeps_block_accounting_exact(
    seed, num_blocks, block_size, budget, max_num_seqs, policy, caching, threshold, chunked, window
):
    """Also with a sliding window over every layer: blocks behind it go back as requests grow."""
    rng = random.Random(seed)
    max_model_len = num_blocks * block_size
    if not chunked:  # every prompt must fit one step, as the engine enforces
        budget = max(budget, max_model_len)
    limits = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        max_num_partial_prefills=2,
        policy=policy,
    )
    manager = BlockManager(num_blocks, block_size, enable_caching=caching, sliding_window=window)
    scheduler = Scheduler(limits, manager)
    worker = _WorkerView()
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    finished_lengths: dict[str, int] = {}
    wanted: dict[str, int] = {}
    for step in range(5000):
        if step < 200 and rng.random() < 0.3:
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(0, 10))]
            max_tokens = rng.randint(1, max(1, min(12, max_model_len - len(prompt))))
            if len(prompt) + max_tokens <= max_model_len:
                request_id = f"r{step}"
                params = SamplingParams(max_tokens=max_tokens)
                scheduler.add_request(
                    Request(
                        request_id, prompt, params, priority=rng.randint(0, 3), arrival_order=step
                    )
                )
                wanted[request_id] = len(prompt) + max_tokens
        if rng.random() < 0.05 and scheduler.requests:
            scheduler.abort_requests([rng.choice(sorted(scheduler.requests))])
        batch = scheduler.schedule()
        _check_invariants(scheduler, manager, batch, limits)
        worker.apply(batch)
        worker.check(scheduler, batch)
        updated, _ = scheduler.update_from_output(batch, _made_up_tokens(scheduler, batch, rng))
        for request in updated:
            if request.is_finished:
                assert request.status == RequestStatus.FINISHED_LENGTH
                finished_lengths[request.request_id] = request.num_tokens
        if step >= 200 and not scheduler.has_unfinished():
            break
    assert not scheduler.has_unfinished(), "every request finishes once arrivals stop"
    assert manager.num_free_blocks == num_blocks
    for request_id, length in finished_lengths.items():
        assert length == wanted[request_id]


def test_prefix_blocks_are_shared_and_evicted_least_recently_used_first():
    manager = BlockManager(num_blocks=6, block_size=2)
    params = SamplingParams(max_tokens=1)
    first = Request("a", [1, 2, 3, 4, 5], params)
    assert manager.allocate_slots(first, 5)
    assert len(manager.cached) == 2  # two full blocks registered
    second = Request("b", [1, 2, 3, 4, 9], params)
    hits = manager.find_cached_prefix(second)
    assert hits == first.block_ids[:2]
    assert manager.allocate_slots(second, 1, hits)
    assert second.num_computed_tokens == 4
    assert [manager.blocks[b].ref_count for b in hits] == [2, 2]
    manager.free(first)
    manager.free(second)
    assert manager.num_free_blocks == 6 and len(manager.cached) == 2
    shared = dict(manager.cached)
    # Freed blocks queue up behind never-used ones, so a new request takes those first and the
    # cached prefix survives; the next allocation then evicts the least recently freed block.
    third = Request("c", [7] * 8, params)
    assert manager.allocate_slots(third, 8)
    assert all(manager.cached.get(h) == b for h, b in shared.items())
    fourth = Request("d", [8] * 2, params)
    assert manager.allocate_slots(fourth, 2)
    assert sum(manager.cached.get(h) == b for h, b in shared.items()) == 1
    manager.free(fourth)
    assert manager.reset_prefix_cache() is False  # blocks in use
    manager.free(third)
    assert manager.reset_prefix_cache() is True and not manager.cached


def test_blocks_are_made_on_first_use_in_the_free_queue_order():
    """A CPU cache of a small model has about a million blocks; they are made as they are first
    taken, in id order, ahead of every freed block, as a queue of all of them would give them."""
    params = SamplingParams(max_tokens=1)
    large = BlockManager(num_blocks=1_000_000, block_size=2)
    first = Request("a", [1, 2, 3], params)
    assert large.allocate_slots(first, 3)
    assert first.block_ids == [0, 1] and len(large.blocks) == 2
    assert large.num_free_blocks == 999_998

    small = BlockManager(num_blocks=3, block_size=2)
    first = Request("a", [1, 2, 3], params)
    assert small.allocate_slots(first, 3)
    small.free(first)  # the tail block is queued first
    second = Request("b", [5] * 6, params)
    assert small.allocate_slots(second, 6)
    assert second.block_ids == [2, 1, 0]
    assert len(small.cached) == 3  # block 0's old prefix was evicted when it was taken


class _EarlierStageView:
    """The tokens a stage before the last knows of each request: the prompt it was sent, then
    the sampled tokens that come in ``new_token_ids`` (it never samples)."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.num_prompt: dict[str, int] = {}

    def apply(self, batch: SchedulerOutput) -> None:
        for request_id in batch.finished_req_ids:
            self.tokens.pop(request_id, None)
        for data in batch.scheduled_reqs:
            if isinstance(data, NewRequestData):
                self.tokens[data.request_id] = list(data.token_ids)
                self.num_prompt[data.request_id] = data.num_prompt_tokens
            else:
                start = max(data.num_computed_tokens, self.num_prompt[data.request_id])
                tokens = self.tokens[data.request_id]
                tokens[start : start + len(data.new_token_ids)] = data.new_token_ids

    def check(self, scheduler: Scheduler, batch: SchedulerOutput) -> None:
        """Every token a step computes is known to the earlier stages when the step runs."""
        for data, num_new in zip(batch.scheduled_reqs, batch.num_scheduled_tokens, strict=True):
            request = scheduler.requests[data.request_id]
            end = data.num_computed_tokens + num_new
            assert self.tokens[data.request_id][:end] == request.token_ids[:end]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([1, 4]),
    budget=st.integers(4, 32),
    max_num_seqs=st.integers(1, 8),
    caching=st.booleans(),
    in_flight=st.sampled_from([2, 3]),
)
def test_steps_in_flight_are_disjoint_and_keep_the_earlier_stages_in_step(
    seed, num_blocks, block_size, budget, max_num_seqs, caching, in_flight
):
    """Pipeline parallelism's batch queue: up to ``in_flight`` steps scheduled before the oldest
    output comes back. A request is in at most one of them, is never preempted (its blocks
    freed) while a step computes it, and the earlier stages learn every sampled token in time."""
    rng = random.Random(seed)
    max_model_len = num_blocks * block_size
    limits = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        max_num_partial_prefills=2,
    )
    manager = BlockManager(num_blocks, block_size, enable_caching=caching)
    scheduler = Scheduler(limits, manager, pipelined=True)
    worker, stage = _WorkerView(), _EarlierStageView()
    queue: list[tuple[SchedulerOutput, dict[str, list[int]]]] = []
    wanted: dict[str, int] = {}
    finished: dict[str, int] = {}
    for step in range(5000):
        if step < 150 and rng.random() < 0.3:
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, 14))]
            max_tokens = rng.randint(1, max(1, min(10, max_model_len - len(prompt))))
            if len(prompt) + max_tokens <= max_model_len:
                request_id = f"r{step}"
                scheduler.add_request(
                    Request(request_id, prompt, SamplingParams(max_tokens=max_tokens))
                )
                wanted[request_id] = len(prompt) + max_tokens
        if rng.random() < 0.03 and scheduler.requests:
            scheduler.abort_requests([rng.choice(sorted(scheduler.requests))])
        batch = scheduler.schedule()
        if batch:
            _check_invariants(scheduler, manager, batch, limits)
            in_other_steps = {i for queued, _ in queue for i in queued.request_ids}
            assert not in_other_steps & set(batch.request_ids)
            worker.apply(batch)
            worker.check(scheduler, batch)
            stage.apply(batch)
            stage.check(scheduler, batch)
            blocks = {i: list(scheduler.requests[i].block_ids) for i in batch.request_ids}
            queue.append((batch, blocks))
        if queue and (len(queue) == in_flight or not batch):
            oldest, blocks = queue.pop(0)
            for request_id, block_ids in blocks.items():
                request = scheduler.requests.get(request_id)
                if request is not None:  # still running: nothing took its blocks meanwhile
                    assert request.status == RequestStatus.RUNNING
                    assert request.block_ids[: len(block_ids)] == block_ids
            output = ModelRunnerOutput.empty(len(oldest.scheduled_reqs))
            for i, (request_id, num_new) in enumerate(
                zip(oldest.request_ids, oldest.num_scheduled_tokens, strict=True)
            ):
                request = scheduler.requests.get(request_id)
                if (
                    request is not None
                    and request.num_computed_tokens + num_new == request.num_tokens
                ):
                    output.sampled[i] = [SampledToken(rng.randrange(50))]
            for request in scheduler.update_from_output(oldest, output)[0]:
                if request.status == RequestStatus.FINISHED_LENGTH:
                    finished[request.request_id] = request.num_tokens
        if step >= 150 and not scheduler.has_unfinished() and not queue:
            break
    assert not scheduler.has_unfinished(), "every request finishes once arrivals stop"
    assert manager.num_free_blocks == num_blocks
    assert not scheduler.in_flight
    for request_id, length in finished.items():
        assert length == wanted[request_id]


def test_a_sliding_window_keeps_a_window_of_blocks_however_long_the_request():
    manager = BlockManager(num_blocks=8, block_size=4, sliding_window=8)
    request = Request("r", list(range(6)), SamplingParams(max_tokens=100))
    assert manager.allocate_slots(request, 6)
    request.num_computed_tokens = 6
    for _ in range(90):  # decode one token a step, far past the 8 blocks the cache has
        request.token_ids.append(1)
        assert manager.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        held = len(request.block_ids) - request.num_released_blocks
        assert held <= 8 // 4 + 2
    assert manager.num_free_blocks == 8 - held
    manager.free(request)
    assert manager.num_free_blocks == 8
    assert all(block.ref_count == 0 for block in manager.blocks)
