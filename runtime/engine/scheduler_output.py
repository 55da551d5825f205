"""The interface between the scheduler and the workers: what one step computes.

A worker keeps its own state of each request it has run (``worker.request_state``), so a step
sends only what changed, as vLLM V1 does: a request the worker has never seen comes whole
(``NewRequestData``); one it holds comes as its new blocks and its computed count
(``CachedRequestData``; after a preemption, all of its blocks, which replace the old ones). The
worker drops a request's state when it appears in ``finished_req_ids``. Under pipeline parallelism
a cached request also carries the sampled tokens the step computes (``new_token_ids``), which the
stages before the last have not seen. Under async scheduling a step may compute a token the
scheduler has not seen yet (the previous step's, still running): the worker takes it from its
own state, where it appended it. A decoding request may carry draft tokens
(``spec_token_ids``, a proposer's guess at what follows): the step computes them too, and the
worker returns the longest prefix its own samples agree with plus its next sample. Under async
scheduling a step scheduled before the request's last one ended does not know that step's
drafts: it carries ``DRAFT_PLACEHOLDER`` for each, and the worker puts in those the proposer
guessed (as vLLM's async scheduler does). Structured output reaches the workers as a bitmask of the
tokens each constrained row may sample (``GrammarBitmask``), never as a grammar.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from infernetes.runtime.kv_transfer.base import KVConnectorMetadata
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch
    from infernetes.runtime.multimodal.inputs import MultiModalFeature


# A draft slot of a step scheduled before the step that guesses its token has ended.
DRAFT_PLACEHOLDER = -1


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
    mm_features: list[MultiModalFeature] = field(default_factory=list)  # its images


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
    # Draft tokens this step verifies after the request's last token (counted in its scheduled
    # tokens): the worker computes them with it and keeps the prefix its own samples agree with.
    # DRAFT_PLACEHOLDER each under async scheduling when the step guessing them still runs.
    spec_token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class GrammarBitmask:
    """The tokens structured output allows the step's constrained rows (``engine/structured_output.py``):
    ``rows`` index ``scheduled_reqs``, a request with drafts once per position it samples (after
    its tokens, then after each draft); bit ``t % 32`` of word ``t // 32`` of a row of ``bitmask``
    (int32 ``[len(rows), ceil(vocab / 32)]``) is set when token ``t`` may come next."""

    rows: list[int]
    bitmask: np.ndarray

    def of_rows(self, batch_rows: list[int]) -> GrammarBitmask | None:
        """The masks of those of ``batch_rows`` that have one, their rows now positions in
        ``batch_rows`` (the rows that sample, as the sampler counts them: a request's n-th row
        there takes its n-th mask)."""
        position = dict(zip(_numbered(batch_rows), itertools.count()))
        keys = _numbered(self.rows)
        keep = [k for k, key in enumerate(keys) if key in position]
        if not keep:
            return None
        return GrammarBitmask([position[keys[k]] for k in keep], self.bitmask[keep])


def _numbered(rows: list[int]) -> list[tuple[int, int]]:
    """Each row with how many times it came before (a request's sampling positions, in order)."""
    seen: dict[int, int] = {}
    numbered = []
    for row in rows:
        numbered.append((row, seen.get(row, 0)))
        seen[row] = seen.get(row, 0) + 1
    return numbered


@dataclass
class SchedulerOutput:
    # The batch, in order (running requests first, then those that joined from the queue), and
    # the number of tokens each computes this step.
    scheduled_reqs: list[NewRequestData | CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    # Requests that ended (finished or aborted) since the last step: the workers drop them.
    finished_req_ids: set[str] = field(default_factory=set)
    # Requests preempted since the last step (their blocks freed): for the KV connector.
    preempted_req_ids: set[str] = field(default_factory=set)
    step_id: int = 0  # the scheduler's number for this step (its output is matched back by it)
    # The KV connector's word to the workers' connectors (with --kv-transfer-config).
    kv_connector_metadata: KVConnectorMetadata | None = None
    grammar_bitmask: GrammarBitmask | None = None  # set by the engine core after scheduling
    # time the forward, waiting for the device (--collect-detailed-traces model or all)
    time_forward: bool = False
    submitted: float = 0.0  # perf_counter when the engine core handed it to the executor
    num_encoder_tokens: int = 0  # multimodal items' encoder tokens the step encodes

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
