"""Request: one sequence being generated (or embedded), with its tokens, blocks and timings."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.model_executor.sampler import TopLogprobs
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.tokenization.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from infernetes.runtime.engine.structured_output import RequestGrammar
    from infernetes.runtime.multimodal.inputs import MultiModalFeature


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"  # its KV connector is bringing its tokens
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (self.FINISHED_STOPPED, self.FINISHED_LENGTH, self.FINISHED_ABORTED)

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.finished else None


@dataclass
class RequestTimes:
    """Monotonic timestamps for the stats; ``arrival_wall`` is wall-clock for RequestMetrics."""

    arrival: float = field(default_factory=time.monotonic)
    arrival_wall: float = field(default_factory=time.time)
    queued: float | None = None  # first time it entered the waiting queue
    scheduled: float | None = None  # first time it was scheduled
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    # seconds of the steps it was in (--collect-detailed-traces): the executor's, the forward's
    model_execute: float = 0.0
    model_forward: float = 0.0


class Request:
    """A prompt plus the tokens generated so far.

    ``num_computed_tokens`` counts the tokens whose keys/values are in the KV cache; the scheduler
    gives the request ``num_tokens - num_computed_tokens`` more (or a chunk of them) each step.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None,
        *,
        prompt: str | None = None,
        eos_token_id: int | None = None,
        priority: int = 0,
        arrival_order: int = 0,
        parent_id: str | None = None,
        index: int = 0,
        pooling: bool = False,
        lora_request: LoRARequest | None = None,
        prompt_embeds: torch.Tensor | None = None,
        prompt_embeds_digest: bytes | None = None,
        mm_features: list[MultiModalFeature] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.arrival_order = arrival_order
        self.parent_id = parent_id or request_id  # the user's request id (n > 1 has children)
        self.index = index
        self.pooling = pooling
        self.lora_request = lora_request
        # A prompt given as embeddings (its token ids are placeholders), and their digest.
        self.prompt_embeds = prompt_embeds
        self.prompt_embeds_digest = prompt_embeds_digest
        self.mm_features = mm_features or []  # its images (placeholder positions, digests)
        # its items whose encoder outputs the workers hold, and their lengths (encoder_budget.py)
        self.encoder_held: dict[str, int] = {}

        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit on first scheduling; -1 until then
        # Of those, the tokens a KV connector brought (vLLM's num_external_computed_tokens).
        self.num_external_computed_tokens = 0
        # Under async scheduling: tokens a step in flight will sample, not known yet. Their
        # positions already count in num_computed_tokens (advanced when the step is scheduled).
        self.num_output_placeholders = 0
        # Draft tokens a proposer guessed to follow token_ids, verified in its next step.
        self.spec_token_ids: list[int] = []

        # KV cache bookkeeping (owned by the BlockManager).
        self.block_ids: list[int] = []
        self.block_hashes: list[Any] = []
        self.num_hashed_blocks = 0
        # The first blocks, given back once every layer's sliding window has passed them; their
        # ids stay in block_ids (the workers' tables keep them, never read within the window).
        self.num_released_blocks = 0

        # What it produced besides tokens (the output processor turns them into vLLM's dicts).
        self.cumulative_logprob = 0.0
        self.logprobs: list[TopLogprobs] | None = None  # when params.logprobs is set
        self.prompt_logprobs: list[TopLogprobs | None] | None = None  # the first is None
        self.pooled: Any = None  # a pooling request's embedding

        self.detokenizer: IncrementalDetokenizer | None = None  # text and stop strings
        # What the KV connector is told of it (the request's own), and once it ended, what the
        # connector said another engine needs to fetch its blocks.
        given = (sampling_params.extra_args or {}) if sampling_params is not None else {}
        params = given.get("kv_transfer_params")
        self.kv_transfer_params: dict[str, Any] | None = dict(params) if params else None
        self.grammar: RequestGrammar | None = None  # its structured output's matcher
        self.times = RequestTimes()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def sort_key(self) -> tuple[int, int]:
        """Priority order: lower ``priority`` first, then earlier arrival (vLLM's convention)."""
        return (self.priority, self.arrival_order)

    @property
    def lora_name(self) -> str | None:
        return None if self.lora_request is None else self.lora_request.lora_name

    @property
    def hash_seed(self) -> Any:
        """What its first block's prefix-cache hash starts from: its adapter, so the same tokens
        under another adapter (or none) never share KV blocks, and for a prompt given as
        embeddings their digest too, so it shares blocks only with the same embeddings (its
        placeholder ids would match any token prompt of zeros)."""
        lora = None if self.lora_request is None else self.lora_request.lora_int_id
        if self.prompt_embeds_digest is None:
            return lora
        return (lora, self.prompt_embeds_digest)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
