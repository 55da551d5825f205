"""Async scheduling's scheduler under random traffic (no model): the next step is scheduled before
the last one's token is known. A fake worker keeps its own request states, as the model runner
does, feeds each placeholder from them and writes a fingerprint of each token's prefix into the
slot it computes, so a block table that points at the wrong or an overwritten slot shows. With
speculation, it guesses drafts (some right, some wrong, some none), fills the draft slots of the
steps planned before them, and computes from its own count of the tokens it kept."""

from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st
from infernetes.runtime.config import SchedulerConfig
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.scheduler import Scheduler
from infernetes.runtime.engine.scheduler_output import (
    DRAFT_PLACEHOLDER,
    NewRequestData,
    SchedulerOutput,
)
from infernetes.runtime.model_executor.sampler import SampledToken
from infernetes.runtime.sampling_params import SamplingParams

EOS = 0
VOCAB = 40


def next_token(tokens: list[int]) -> int:
    """The fake model: a deterministic function of everything before, EOS now and then."""
    return hash(tuple(tokens)) % VOCAB


class _FakeWorker:
    """Runs each step as it is sent, from the SchedulerOutputs alone (as the runner does)."""

    def __init__(
        self, block_size: int, max_model_len: int, spec_tokens: int = 0, seed: int = 0
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.tokens: dict[str, list[int]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.limits: dict[str, int] = {}  # the most tokens each may hold
        self.kv: dict[int, int] = {}  # slot -> fingerprint of the prefix ending there
        self.spec_tokens = spec_tokens
        self.rng = random.Random(seed)
        self.computed: dict[str, int] = {}  # its own count of each request's computed tokens
        self.next_drafts: dict[str, list[int]] = {}  # guessed after its last step

    def _guess(self, tokens: list[int]) -> list[int]:
        """Up to ``spec_tokens`` drafts: the fake model's own tokens, with a wrong one now and
        then, or none."""
        drafts: list[int] = []
        for _ in range(self.rng.randint(0, self.spec_tokens)):
            right = next_token(tokens + drafts)
            drafts.append(right if self.rng.random() < 0.7 else (right + 1) % VOCAB)
        return drafts

    def _sample(self, tokens: list[int], drafts: list[int]) -> list[int]:
        """The kept drafts and the next token, appended to ``tokens``."""
        kept = []
        for draft in [*drafts, None]:
            token = next_token(tokens)
            tokens.append(token)
            kept.append(token)
            if token != draft:
                break
        return kept

    def _slot(self, request_id: str, position: int) -> int:
        size = self.block_size
        return self.blocks[request_id][position // size] * size + position % size

    def execute(self, batch: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in batch.finished_req_ids:
            self.tokens.pop(request_id, None)
            self.blocks.pop(request_id, None)
        output = ModelRunnerOutput.empty(len(batch.scheduled_reqs))
        for i, (data, num_new) in enumerate(
            zip(batch.scheduled_reqs, batch.num_scheduled_tokens, strict=True)
        ):
            request_id = data.request_id
            start = data.num_computed_tokens
            drafts: list[int] = []
            if isinstance(data, NewRequestData):
                self.tokens[request_id] = list(data.token_ids)
                self.blocks[request_id] = list(data.block_ids)
                assert data.sampling_params is not None and data.sampling_params.max_tokens
                self.limits[request_id] = min(
                    data.num_prompt_tokens + data.sampling_params.max_tokens, self.max_model_len
                )
            elif data.resumed_from_preemption:
                self.blocks[request_id] = list(data.new_block_ids)
                assert data.num_tokens is not None
                del self.tokens[request_id][data.num_tokens :]  # a discarded step's token
            else:
                self.blocks[request_id].extend(data.new_block_ids)
                # the scheduler counts the drafts in flight as kept: it may only run ahead
                start = self.computed[request_id]
                assert start <= data.num_computed_tokens
                drafts = data.spec_token_ids
                if DRAFT_PLACEHOLDER in drafts:
                    assert set(drafts) == {DRAFT_PLACEHOLDER}
                    drafts = self.next_drafts.get(request_id, [])[: len(drafts)]
                num_new -= len(data.spec_token_ids) - len(drafts)
            self.next_drafts.pop(request_id, None)
            tokens = self.tokens[request_id]
            end = start + num_new
            with_drafts = tokens + drafts
            assert end <= len(with_drafts), "a placeholder the worker has not sampled"
            assert end <= self.max_model_len
            for position in range(start):  # what it attends to is its own prefix
                assert self.kv[self._slot(request_id, position)] == hash(
                    tuple(tokens[: position + 1])
                )
            for position in range(start, end):
                self.kv[self._slot(request_id, position)] = hash(tuple(with_drafts[: position + 1]))
            if end == len(with_drafts):
                # a step for a request sure to have ended is never scheduled (EOS can't be known)
                limit = self.limits[request_id]
                assert len(with_drafts) < limit, "a step past the length limit"
                output.sampled[i] = [SampledToken(t) for t in self._sample(tokens, drafts)]
                output.num_drafts[i] = len(drafts)
                if self.spec_tokens:
                    output.draft_token_ids[i] = self.next_drafts[request_id] = self._guess(tokens)
            self.computed[request_id] = min(end, len(tokens) - 1)
        return output


def _expected(prompt: list[int], max_tokens: int, max_model_len: int) -> list[int]:
    tokens = list(prompt)
    while True:
        tokens.append(next_token(tokens))
        out = len(tokens) - len(prompt)
        if out >= max_tokens or len(tokens) >= max_model_len or tokens[-1] == EOS:
            return tokens[len(prompt) :]


def _check_blocks(scheduler: Scheduler, manager: BlockManager) -> None:
    held: dict[int, int] = {}
    for request in scheduler.running:
        for block_id in request.block_ids:
            held[block_id] = held.get(block_id, 0) + 1
        # room for every token computed or in flight
        assert len(request.block_ids) * manager.block_size >= request.num_computed_tokens
        assert request.num_output_placeholders <= 2 * (1 + scheduler.num_spec_tokens)
    for block in manager.blocks:
        assert block.ref_count == held.get(block.block_id, 0)
        assert (block.ref_count == 0) == (block.block_id in manager.free_queue)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([1, 4, 8]),
    budget=st.integers(4, 48),
    max_num_seqs=st.integers(1, 8),
    policy=st.sampled_from(["fcfs", "priority"]),
    caching=st.booleans(),
    chunked=st.booleans(),
    spec_tokens=st.sampled_from([0, 0, 1, 3]),
)
def test_async_steps_emit_every_token_once_and_keep_block_accounting_exact(
    seed, num_blocks, block_size, budget, max_num_seqs, policy, caching, chunked, spec_tokens
):
    rng = random.Random(seed)
    max_model_len = num_blocks * block_size
    if not chunked:
        budget = max(budget, max_model_len)
    limits = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 3]) if chunked else 0,
        max_num_partial_prefills=2,
        policy=policy,
        async_scheduling=True,
    )
    manager = BlockManager(num_blocks, block_size, enable_caching=caching)
    scheduler = Scheduler(limits, manager, num_spec_tokens=spec_tokens)
    worker = _FakeWorker(block_size, max_model_len, spec_tokens, seed)
    queue: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    expected: dict[str, list[int]] = {}
    emitted: dict[str, list[int]] = {}
    ended: dict[str, RequestStatus] = {}
    for step in range(5000):
        if step < 200 and rng.random() < 0.3:
            prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 8))]
            max_tokens = rng.randint(1, 12)
            if len(prompt) < max_model_len:
                request_id = f"r{step % 50}"  # ids come back once their request has ended
                if request_id not in scheduler.requests:
                    scheduler.add_request(
                        Request(
                            request_id,
                            prompt,
                            SamplingParams(max_tokens=max_tokens),
                            eos_token_id=EOS,
                            priority=rng.randint(0, 3),
                            arrival_order=step,
                        )
                    )
                    expected[request_id] = _expected(prompt, max_tokens, max_model_len)
                    emitted[request_id] = []
                    ended.pop(request_id, None)
        if rng.random() < 0.03 and scheduler.requests:
            aborted = rng.choice(sorted(scheduler.requests))
            scheduler.abort_requests([aborted])
            ended[aborted] = RequestStatus.FINISHED_ABORTED
        batch = scheduler.schedule() if len(queue) < 2 else SchedulerOutput()
        if batch:
            assert batch.total_num_scheduled_tokens <= limits.max_num_batched_tokens
            assert len(scheduler.running) <= max_num_seqs
            queue.append((batch, worker.execute(batch)))  # the worker runs steps in order
        _check_blocks(scheduler, manager)
        if queue and (len(queue) == 2 or not batch):
            step_output, model_output = queue.popleft()
            num_tokens = {r.request_id: r.num_tokens for r in scheduler.requests.values()}
            # the drafts verified for requests still running count (not the empty draft slots)
            verified = sum(
                n
                for request, n in zip(
                    scheduler._steps[step_output.step_id], model_output.num_drafts, strict=True
                )
                if request.status == RequestStatus.RUNNING
            )
            updated, iteration = scheduler.update_from_output(step_output, model_output)
            assert iteration.num_draft_tokens == verified
            for request in updated:
                emitted[request.request_id] += request.token_ids[num_tokens[request.request_id] :]
                if request.is_finished:
                    ended[request.request_id] = request.status
        for request_id, tokens in emitted.items():
            if ended.get(request_id) != RequestStatus.FINISHED_ABORTED:
                assert tokens == expected[request_id][: len(tokens)], "a token lost or repeated"
        if step >= 200 and not scheduler.has_unfinished() and not queue:
            break
    assert not scheduler.has_unfinished(), "every request finishes once arrivals stop"
    assert manager.num_free_blocks == num_blocks
    for request_id, status in ended.items():
        if status != RequestStatus.FINISHED_ABORTED:
            assert emitted[request_id] == expected[request_id]


def test_prefix_cache_hashes_wait_for_the_sampled_token():
    """A block that a placeholder fills is hashed once its token is known, from the real tokens."""
    limits = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, async_scheduling=True
    )
    manager = BlockManager(16, 4, enable_caching=True)
    scheduler = Scheduler(limits, manager)
    worker = _FakeWorker(4, 64)
    request = Request("a", [5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=8), eos_token_id=EOS)
    scheduler.add_request(request)
    first = scheduler.schedule()  # the prompt; the 8th token is a placeholder
    second = scheduler.schedule()  # that placeholder, before it is known, fills block 2
    assert request.num_output_placeholders == 2 and request.num_tokens == 7
    assert len(request.block_hashes) == 1  # block 2 holds a token not known yet
    scheduler.update_from_output(first, worker.execute(first))
    scheduler.update_from_output(second, worker.execute(second))
    scheduler.schedule()
    assert len(request.block_hashes) == 2
    block_hash = manager._hash(request.block_hashes[0], tuple(request.token_ids[4:8]))
    assert manager.cached[block_hash] == request.block_ids[1]
