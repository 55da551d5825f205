"""What the workers return for a step, in the order of the ``SchedulerOutput``'s batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from infernetes.runtime.kv_transfer.base import KVConnectorOutput
from infernetes.runtime.model_executor.sampler import SampledToken, TopLogprobs


@dataclass
class ModelRunnerOutput:
    """Per scheduled request: its new token (None for a prefill chunk that does not reach the
    end of the prompt), the prompt logprobs of this chunk, and (pooling models) its embedding.
    ``errors`` names the requests whose logits processor raised (they end alone);
    ``kv_connector_output`` what the KV connector finished sending and receiving."""

    sampled: list[SampledToken | None] = field(default_factory=list)
    prompt_logprobs: list[list[TopLogprobs] | None] = field(default_factory=list)
    pooled: list[torch.Tensor | None] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    kv_connector_output: KVConnectorOutput | None = None  # None: no connector

    @classmethod
    def empty(cls, num_requests: int) -> ModelRunnerOutput:
        return cls([None] * num_requests, [None] * num_requests, [None] * num_requests)
