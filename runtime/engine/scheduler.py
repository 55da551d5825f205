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

A step may add several tokens to a request (speculative decoding's seam): the draft tokens a
proposer guessed after its last step (``Request.spec_token_ids``) are scheduled after its last
token, the workers verify them, and ``update_from_output()`` appends every token the step kept,
checking the stop conditions after each, and takes back the computed count of the drafts it
did not keep. Under async scheduling, a step scheduled while the request's last one still runs
cannot know that step's drafts nor how many of its own it keeps (vLLM's async scheduler's
case): it reserves ``num_speculative_tokens`` draft slots (``DRAFT_PLACEHOLDER``) as if every
draft in flight were kept, counting the step's drafts and next token as placeholders; the
worker fills the slots with the drafts it guessed and computes from where its own kept tokens
end, and ``update_from_output()`` takes back what the step did not keep.

With a KV connector (``--kv-transfer-config``, ``runtime/kv_transfer/``) the scheduler asks it how
many of a waiting request's tokens it brings (counted as computed; brought later, the request
waits in ``waiting_for_remote_kvs``, holding the blocks of all its tokens, until a worker reports
them received, then goes ahead of any waiting request short of blocks; a failed load leaves
those tokens to compute),
gives it each step's metadata for the workers, and tells it when a request ends; a request whose
blocks it is still sending keeps them in ``sending`` until a worker reports them sent. While
either holds a request, steps run even with nothing to compute, so the workers can report.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from infernetes.runtime.config import SchedulerConfig
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.encoder_budget import EncoderBudget
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.request_queue import FCFSQueue, PriorityQueue
from infernetes.runtime.engine.scheduler_output import (
    DRAFT_PLACEHOLDER,
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from infernetes.runtime.engine.stats import (
    FinishedRequestStats,
    IterationStats,
    KVTransfer,
    PrefixCacheStats,
    SchedulerStats,
    finished_request_stats,
)
from infernetes.runtime.engine.stop_checker import check_stop
from infernetes.runtime.kv_transfer.base import KVConnectorBase, KVConnectorOutput
from infernetes.runtime.model_executor.sampler import SampledToken


@dataclass
class _StepBudget:
    """What is left of one step while it is being scheduled."""

    tokens: int
    encoder: EncoderBudget
    partial_prefills: int = 0  # prefills that will not finish this step
    long_partial_prefills: int = 0


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        *,
        pipelined: bool = False,
        connector: KVConnectorBase | None = None,
        whole_images: bool = False,
        num_lookahead_tokens: int = 0,
        num_spec_tokens: int = 0,
        spec_disable_batch_size: int | None = None,
    ) -> None:
        self.config = config
        # the model's image tokens see their whole image (Gemma 3): no chunk ends inside one
        self.whole_images = whole_images
        # slots past a step's tokens that its draft model writes (spec_decode/draft_model.py)
        self.num_lookahead_tokens = num_lookahead_tokens
        # --speculative-config's num_speculative_tokens: the draft slots a step scheduled before
        # its drafts are known reserves (async scheduling)
        self.num_spec_tokens = num_spec_tokens
        # --speculative-config's disable_by_batch_size: under this much load drafts wait
        self.spec_disable_batch_size = spec_disable_batch_size
        self.block_manager = block_manager
        self.pipelined = pipelined  # the workers of the earlier stages need the sampled tokens
        self.async_scheduling = config.async_scheduling
        # Pipelined: scheduled in a step whose output has not come back (not scheduled again).
        self.in_flight: set[str] = set()
        self._steps: dict[int, list[Request]] = {}  # the requests of each step not yet updated
        self._next_step_id = 0
        self.waiting: FCFSQueue | PriorityQueue = (
            PriorityQueue() if config.policy == "priority" else FCFSQueue()
        )
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_preemptions_step = 0
        # Requests that ended since the last step: the workers drop their state.
        self._finished_req_ids: set[str] = set()
        self._preempted_req_ids: set[str] = set()  # since the last step
        self._finished_stats: list[FinishedRequestStats] = []  # not yet reported
        self.connector = connector  # the KV connector's scheduler side
        # Holding blocks while the connector fills them (an async load) or sends them (finished).
        self.waiting_for_remote_kvs: dict[str, Request] = {}
        self.sending: dict[str, Request] = {}
        self._kv_transfers: list[KVTransfer] = []  # the workers' copies not yet reported

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
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            del self.waiting_for_remote_kvs[request.request_id]
        else:
            self.waiting.remove(request)
        request.status = status
        request.times.finished = time.monotonic()
        self._free_blocks(request)
        self.requests.pop(request.request_id, None)
        self._finished_req_ids.add(request.request_id)
        self._finished_stats.append(finished_request_stats(request))

    def _free_blocks(self, request: Request) -> None:
        """Free an ended request's blocks, unless the connector is still sending them."""
        if self.connector is not None:
            keep, request.kv_transfer_params = self.connector.request_finished(
                request, list(request.block_ids)
            )
            if keep:
                self.sending[request.request_id] = request
                return
        self.block_manager.free(request)

    def finish_kv_transfers(self, output: KVConnectorOutput) -> None:
        """What the workers' connectors finished: received requests go back to the queue (their
        tokens now computed), sent ones free their blocks. A request aborted while receiving is
        no longer waiting for it."""
        self.connector.update_connector_output(output)  # type: ignore[union-attr]  # it reported
        self._kv_transfers += output.transfers
        for request_id in output.finished_recving | output.failed_recving:
            request = self.waiting_for_remote_kvs.pop(request_id, None)
            if request is not None:
                if request_id in output.failed_recving:
                    self._forget_external(request)
                request.status = RequestStatus.WAITING
                self.waiting.add_front(request)
        for request_id in output.finished_sending:
            self.block_manager.free(self.sending.pop(request_id))

    @property
    def awaits_kv_transfer(self) -> bool:
        return bool(self.waiting_for_remote_kvs) or bool(self.sending)

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
        return len(self.waiting) + len(self.waiting_for_remote_kvs)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(self.waiting) or bool(self.waiting_for_remote_kvs)

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
            kv_transfers=self._take_kv_transfers(),
        )

    def _take_kv_transfers(self) -> list[KVTransfer]:
        taken, self._kv_transfers = self._kv_transfers, []
        return taken

    # -- scheduling ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        config = self.config
        encoder = EncoderBudget(
            config.max_num_encoder_input_tokens or config.max_num_batched_tokens,
            config.encoder_cache_size or config.max_num_batched_tokens,
            (request for request in self.requests.values() if request.encoder_held),
        )
        budget = _StepBudget(config.max_num_batched_tokens, encoder)
        self.num_preemptions_step = 0
        # First, the RUNNING requests, in order, preempting the last to arrive when blocks run out.
        self._schedule_running(output, budget)
        # Next, the WAITING requests (new or preempted), only when nothing had to be preempted.
        if not self.num_preemptions_step:
            self._schedule_waiting(output, budget)
        output.num_encoder_tokens = encoder.num_tokens
        output.finished_req_ids, self._finished_req_ids = self._finished_req_ids, set()
        output.preempted_req_ids, self._preempted_req_ids = self._preempted_req_ids, set()
        if output or self.awaits_kv_transfer:  # (an empty step lets the workers report)
            self._register_step(output)
        if self.connector is not None:
            output.kv_connector_metadata = self.connector.build_connector_meta(output)
        return output

    def _register_step(self, output: SchedulerOutput) -> None:
        """Number the step and remember its requests; under async scheduling, advance them past
        it now, a placeholder for each token it may add (its drafts and the next one)."""
        output.step_id = self._next_step_id
        self._next_step_id += 1
        requests = [self.requests[request_id] for request_id in output.request_ids]
        self._steps[output.step_id] = requests
        if self.pipelined:
            self.in_flight.update(output.request_ids)
        if not self.async_scheduling:
            return
        for request, data, num_new in zip(
            requests, output.scheduled_reqs, output.num_scheduled_tokens, strict=True
        ):
            num_drafts = _num_drafts(data)
            end = request.num_computed_tokens + num_new
            if not request.pooling and end - num_drafts == (
                request.num_tokens + request.num_output_placeholders
            ):
                request.num_output_placeholders += 1 + num_drafts
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
            drafts = self._drafts_to_verify(request, remaining, budget.tokens)
            chunk = self._prefill_chunk(remaining, budget.tokens)
            chunk = self._fit_images(request, request.num_computed_tokens, chunk, remaining, budget)
            chunk = budget.encoder.fit(request, request.num_computed_tokens, chunk)
            if chunk == 0:
                i += 1
                continue
            num_new = chunk + len(drafts)
            num_blocks_before = len(request.block_ids)
            while not self.block_manager.allocate_slots(
                request, num_new, num_lookahead_tokens=self.num_lookahead_tokens
            ):
                victim = self._pick_victim(i)
                self.running.remove(victim)
                self._preempt(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted itself; self.running[i] is now the next request
            self._count_partial(budget, remaining, num_new)
            request.spec_token_ids = []  # verified in this step, or guessed again after it
            data = CachedRequestData(
                request.request_id,
                request.block_ids[num_blocks_before:],
                request.num_computed_tokens,
                new_token_ids=self._sampled_tokens(request, num_new - len(drafts)),
                spec_token_ids=drafts,
            )
            output.add(data, num_new)
            budget.encoder.charge(request, request.num_computed_tokens, num_new)
            budget.tokens -= num_new
            i += 1

    def _schedule_waiting(self, output: SchedulerOutput, budget: _StepBudget) -> None:
        skipped: list[Request] = []
        while (
            len(self.waiting) and budget.tokens > 0 and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            cached: list[int] = []
            # (a request back from a failed remote load holds its blocks, maybe none computed)
            fresh = request.num_computed_tokens == 0 and not request.block_ids
            if fresh and not _wants_prompt_logprobs(request):
                cached = self.block_manager.find_cached_prefix(request)
            num_cached = len(cached) * self.block_manager.block_size
            num_external, load_async = self._external_tokens(request, num_cached)
            if load_async:
                if self._start_remote_load(request, cached, num_external):
                    continue
                if self._must_wait_for_blocks():
                    break
                skipped.append(self.waiting.pop())
                continue
            # (a request back from a remote load holds its blocks: its computed tokens count)
            remaining = request.num_tokens - request.num_computed_tokens - num_cached - num_external
            if not self.config.enable_chunked_prefill and remaining > budget.tokens:
                break
            if not self._lora_fits(request):
                skipped.append(self.waiting.pop())  # its adapter would be one too many
                continue
            chunk = self._prefill_chunk(remaining, budget.tokens)
            start = request.num_computed_tokens + num_cached + num_external
            chunk = self._fit_images(request, start, chunk, remaining, budget)
            chunk = budget.encoder.fit(request, start, chunk)
            if chunk < remaining and not self.config.enable_chunked_prefill:
                chunk = 0  # its items' encoding waits for a step with room for all of them
            if chunk == 0:  # an item that does not fit this step's budgets
                skipped.append(self.waiting.pop())
                continue
            if chunk < remaining and not self._may_start_partial(budget, remaining):
                # Another partial prefill is not allowed: let a shorter request go instead.
                skipped.append(self.waiting.pop())
                continue
            if not self.block_manager.allocate_slots(
                request,
                num_external + chunk,
                cached,
                num_lookahead_tokens=self.num_lookahead_tokens,
            ):
                if request.block_ids or self._must_wait_for_blocks():
                    break
                skipped.append(self.waiting.pop())
                continue
            if self.connector is not None:
                self.connector.update_state_after_alloc(
                    request, list(request.block_ids), num_external
                )
                self._count_external(request, num_external)
            self.waiting.pop()
            output.add(self._admit(request, num_cached), chunk)
            budget.encoder.charge(request, start, chunk)
            self._count_partial(budget, remaining, chunk)
            budget.tokens -= chunk
        for request in reversed(skipped):
            self.waiting.add_front(request)

    def _external_tokens(self, request: Request, num_cached: int) -> tuple[int, bool]:
        """The tokens past ``num_cached`` the connector brings for a request that holds no
        blocks yet, and whether they arrive later."""
        if self.connector is None or request.num_computed_tokens or request.block_ids:
            return 0, False
        return self.connector.get_num_new_matched_tokens(request, num_cached)

    def _must_wait_for_blocks(self) -> bool:
        """Whether the first waiting request, short of blocks, keeps the others waiting: not
        when some hold blocks already (their KV arrived from a connector), else each could wait
        for the others' blocks for ever."""
        return not any(request.block_ids for request in self.waiting)

    def _start_remote_load(self, request: Request, cached: list[int], num_external: int) -> bool:
        """Give ``request`` the blocks the connector fills for it (not findable by other requests
        until filled), and those of the rest of its tokens, so that it needs no more to start
        once they arrive; set it aside until a worker reports them received."""
        num_computed = request.num_computed_tokens + len(cached) * self.block_manager.block_size
        num_new = request.num_tokens - num_computed
        if not self.block_manager.allocate_slots(request, num_new, cached, findable=False):
            return False
        self.connector.update_state_after_alloc(  # type: ignore[union-attr]  # it brings them
            request, list(request.block_ids), num_external
        )
        self._count_external(request, num_external)
        # its prefix-cache hit is counted now (admitted later, it looks up nothing more)
        self.prefix_cache_stats.hits += len(cached) * self.block_manager.block_size
        self.waiting.pop()
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.waiting_for_remote_kvs[request.request_id] = request
        return True

    @staticmethod
    def _forget_external(request: Request) -> None:
        """A failed load: the tokens it was to bring are computed instead (in the blocks the
        request holds, not yet findable)."""
        request.num_computed_tokens -= request.num_external_computed_tokens
        request.num_external_computed_tokens = 0

    @staticmethod
    def _count_external(request: Request, num_external: int) -> None:
        """The connector's tokens count as computed; on a first scheduling, as brought by it."""
        request.num_computed_tokens += num_external
        if request.num_cached_tokens < 0 and num_external:
            request.num_external_computed_tokens = num_external

    def _remaining(self, request: Request) -> int:
        """Tokens a running request may compute next: those not computed yet, counting the
        tokens its steps in flight will sample (async scheduling), but none for a request that
        is sure to end when those arrive (its token would be thrown away), nor for one with a
        grammar (its next mask follows the token in flight)."""
        placeholders = request.num_output_placeholders
        if placeholders and (request.grammar is not None or self._ends_with_placeholders(request)):
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

    def _drafts_to_verify(self, request: Request, remaining: int, budget: int) -> list[int]:
        """The draft tokens a decoding request verifies this step: as many as fit the budget,
        the context length and ``max_tokens`` (a step adds at most one token past its drafts).
        While a step of the request is in flight (async scheduling), placeholders for the drafts
        it will guess, the room counted as if it kept all of its own (never for structured
        output, whose masks need the drafts: it waits for that step, ``_remaining``)."""
        placeholders = request.num_output_placeholders
        if placeholders:
            drafts = [DRAFT_PLACEHOLDER] * self.num_spec_tokens
        else:
            drafts = request.spec_token_ids
        if not drafts or remaining != 1:
            return []
        if self.spec_disable_batch_size and len(self.running) >= self.spec_disable_batch_size:
            return []  # vLLM's disable_by_batch_size: at this load drafts cost more than they save
        room = min(budget, self.config.max_model_len - request.num_tokens - placeholders) - 1
        params = request.sampling_params
        if params is not None and params.max_tokens is not None:
            room = min(room, params.max_tokens - request.num_output_tokens - placeholders - 1)
        return drafts[: max(room, 0)]

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
                request.mm_features,
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
        if request.num_cached_tokens < 0:  # local hits, and what a connector brought
            request.num_cached_tokens = request.num_computed_tokens
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

    def _fit_images(
        self, request: Request, start: int, chunk: int, remaining: int, budget: _StepBudget
    ) -> int:
        """``chunk`` (from position ``start``) kept from ending inside an image when the model's
        image tokens see their whole image (its later tokens' keys would be missing): cut back
        to the image's start, or, when the chunk starts in the image, stretched to its end (past
        the long-prefill cap) if the step's budget holds it, else 0: it waits for room."""
        if not self.whole_images or chunk >= remaining:
            return chunk
        end = start + chunk
        for feature in request.mm_features:
            if feature.offset < end < feature.end:
                if feature.offset > start:
                    return feature.offset - start
                return feature.end - start if feature.end - start <= budget.tokens else 0
        return chunk

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
        request.spec_token_ids = []
        request.encoder_held.clear()  # the workers drop its encoder outputs when it resumes
        self.num_preemptions_step += 1
        self._preempted_req_ids.add(request.request_id)
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
        """Advance each scheduled request past this step's tokens, append the tokens it sampled
        (its accepted drafts and the next token), check its stop conditions after each, finish it
        if done. Returns the requests with something new (a token, prompt logprobs, an
        embedding, an end) in batch order, and the step's statistics."""
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
            if not sampled:
                continue  # a prefill chunk that does not reach the end of the prompt
            # the draft slots not kept (rejected, or never filled) were counted for nothing
            num_slots = _num_drafts(scheduler_output.scheduled_reqs[i])
            request.num_output_placeholders = max(
                request.num_output_placeholders - 1 - num_slots, 0
            )
            request.num_computed_tokens -= num_slots + 1 - len(sampled)
            num_drafts = model_output.num_drafts[i]  # those the worker had and verified
            iteration.num_drafts += int(num_drafts > 0)
            iteration.num_draft_tokens += num_drafts
            iteration.count_accepted(len(sampled) - 1, num_drafts)
            error = model_output.errors.get(request.request_id)
            self._append_tokens(request, sampled, error, now, iteration)
            if not request.is_finished and model_output.draft_token_ids:
                request.spec_token_ids = model_output.draft_token_ids[i]
            updated.append(request)
        iteration.finished_requests = self.take_finished_stats()
        return updated, iteration

    def _first_token(self, request: Request, now: float, iteration: IterationStats) -> None:
        request.times.first_token = request.times.last_token = now
        iteration.count_prompt(
            request.num_prompt_tokens,
            min(max(request.num_cached_tokens, 0), request.num_prompt_tokens),
            request.num_external_computed_tokens,
        )
        iteration.time_to_first_tokens_iter.append(now - request.times.arrival)

    def _append_tokens(
        self,
        request: Request,
        sampled: list[SampledToken],
        error: str | None,
        now: float,
        iteration: IterationStats,
    ) -> None:
        """Append a step's tokens one at a time, each checked against the stop conditions: a
        request that stops on one drops those after it."""
        last_token = request.times.last_token
        if last_token is None:
            self._first_token(request, now, iteration)
        else:
            iteration.inter_token_latencies_iter.append(now - last_token)
            request.times.last_token = now
        for token in sampled:
            request.append_token(token.token_id)
            iteration.num_generation_tokens += 1
            if token.logprobs is not None and request.logprobs is not None:
                request.cumulative_logprob += token.logprobs.logprob
                request.logprobs.append(token.logprobs)
            if error is not None:
                # Its logits processor raised: end this request alone; the batch goes on.
                request.stop_reason = f"error: {error}"
                self.finish_request(request, RequestStatus.FINISHED_ABORTED)
                return
            status, stop_reason = check_stop(request, token.token_id, self.config.max_model_len)
            if status is not None:
                request.stop_reason = stop_reason
                self.finish_request(request, status)
                return


def _num_drafts(data: NewRequestData | CachedRequestData) -> int:
    """The draft slots a request's step holds (known drafts or placeholders)."""
    return len(data.spec_token_ids) if isinstance(data, CachedRequestData) else 0


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
