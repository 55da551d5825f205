"""The interface between the scheduler and the workers: what one step computes.

A worker keeps its own state of each request it has run (``worker.request_state``), so a step
sends only what changed, as vLLM V1 does: a request the worker has never seen comes whole
(``NewRequestData``); one it holds comes as its new blocks and its computed count
(``CachedRequestData``; after a preemption, all of its blocks, which replace the old ones). The
worker drops a request's state when it appears in ``finished_req_ids``. Under pipeline parallelism
a cached request also carries the sampled tokens the step computes (``new_token_ids``), which the
stages before the last have not seen. Under async scheduling a step may compute a token the
scheduler has not seen yet (the previous step's, still running): the worker takes it from its
own state, where it appended it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class NewRequestData:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams | None  # None: a pooling request
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int  # prefix-cache hits count as computed
    lora_request: LoRARequest | None = None  # the adapter it runs with
    # A prompt given as embeddings, [num_prompt_tokens, hidden] (its token ids are placeholders).
    prompt_embeds: torch.Tensor | None = None


@dataclass(frozen=True)
class CachedRequestData:
    request_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    resumed_from_preemption: bool = False  # new_block_ids are then all of its blocks
    # Under pipeline parallelism, the sampled tokens this step computes: only the last stage
    # samples, and the earlier ones learn its tokens here instead of waiting for them each step.
    new_token_ids: list[int] = field(default_factory=list)
    # Under async scheduling, after a preemption: the tokens the request holds. A token the worker
    # sampled past them came from a step the preemption discarded; it drops it.
    num_tokens: int | None = None


@dataclass
class SchedulerOutput:
    # The batch, in order (running requests first, then those that joined from the queue), and
    # the number of tokens each computes this step.
    scheduled_reqs: list[NewRequestData | CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    # Requests that ended (finished or aborted) since the last step: the workers drop them.
    finished_req_ids: set[str] = field(default_factory=set)
    step_id: int = 0  # the scheduler's number for this step (its output is matched back by it)

    def add(self, request: NewRequestData | CachedRequestData, num_tokens: int) -> None:
        self.scheduled_reqs.append(request)
        self.num_scheduled_tokens.append(num_tokens)

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.scheduled_reqs]

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    def __bool__(self) -> bool:
        return bool(self.scheduled_reqs)
