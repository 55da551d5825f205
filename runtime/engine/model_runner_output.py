"""What the workers return for a step, in the order of the ``SchedulerOutput``'s batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from infernetes.runtime.kv_transfer.base import KVConnectorOutput
from infernetes.runtime.model_executor.sampler import SampledToken, TopLogprobs


@dataclass
class ModelRunnerOutput:
    """Per scheduled request: the tokens this step adds (one; several when its draft tokens were
    accepted; none for a prefill chunk that does not reach the end of the prompt), the prompt
    logprobs of this chunk, (pooling models) its embedding, and the draft tokens the proposer
    guesses follow them, and how many drafts it verified (under async scheduling fewer than
    scheduled when its proposer guessed fewer, ``scheduler_output.DRAFT_PLACEHOLDER``). ``errors`` names the requests whose logits processor raised (they end
    alone); ``kv_connector_output`` what the KV connector finished sending and receiving."""

    sampled: list[list[SampledToken]] = field(default_factory=list)
    prompt_logprobs: list[list[TopLogprobs] | None] = field(default_factory=list)
    pooled: list[torch.Tensor | None] = field(default_factory=list)
    draft_token_ids: list[list[int]] = field(default_factory=list)
    num_drafts: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    kv_connector_output: KVConnectorOutput | None = None  # None: no connector
    forward_time: float = 0.0  # seconds of the model's forward, when the step asked (time_forward)

    @classmethod
    def empty(cls, num_requests: int) -> ModelRunnerOutput:
        return cls(
            [[] for _ in range(num_requests)],
            [None] * num_requests,
            [None] * num_requests,
            [[] for _ in range(num_requests)],
            [0] * num_requests,
        )
