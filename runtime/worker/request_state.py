"""A worker's own state of each request it runs, kept across steps (vLLM V1's
``CachedRequestState``): the scheduler sends only what changed, and the sampled tokens are
appended here as they are drawn, so the next step's input is at hand without a round trip."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from infernetes.runtime.engine.scheduler_output import NewRequestData
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.multimodal.inputs import MultiModalFeature
from infernetes.runtime.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    request_id: str
    token_ids: list[int]  # the prompt, then every token sampled so far
    num_prompt_tokens: int
    sampling_params: SamplingParams | None
    eos_token_id: int | None
    row: int  # its row of the worker's block table (input_batch.BlockTable); -1: none
    num_computed_tokens: int
    generator: Any = None  # torch.Generator of a seeded request: its own random stream
    error: Exception | None = field(default=None)  # its logits processor raised
    lora_request: LoRARequest | None = None
    # Async scheduling: a seeded request's generator state before its last draw, restored when a
    # preemption discards the step that drew (so its stream goes on as the synchronous engine's).
    generator_state: torch.Tensor | None = None
    # Draft tokens of this step, at the end of token_ids while it runs (spec_decode.verify).
    num_drafts: int = 0
    # What the proposer guessed after its last step: the drafts of a step the scheduler planned
    # before it learnt them (async scheduling, scheduler_output.DRAFT_PLACEHOLDER).
    next_drafts: list[int] = field(default_factory=list)
    # A prompt given as embeddings: the model runner feeds their rows in place of the prompt's
    # placeholder token ids.
    prompt_embeds: torch.Tensor | None = None
    # Its images: where their placeholder tokens are and the encoder's input.
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    # The encoder's output of each image (by identifier) whose placeholders are not all computed
    # yet: encoded once for all the chunks it spans; dropped once passed (a preemption that
    # recomputes the prompt encodes it again), and with the request.
    encoder_outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    # An encoder-decoder model's (Whisper's) cross-attention keys and values of its audio, per
    # decoder layer: made at its first step, kept until it finishes
    cross_keys_values: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    # An M-RoPE model's positions of the prompt (worker/mrope.PromptLayout); None: text only
    mrope_layout: Any = None

    @classmethod
    def from_new(cls, data: NewRequestData, row: int) -> CachedRequestState:
        params = data.sampling_params
        generator = None
        if params is not None and params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed)
        return cls(
            data.request_id,
            list(data.token_ids),
            data.num_prompt_tokens,
            params,
            data.eos_token_id,
            row,
            data.num_computed_tokens,
            generator,
            lora_request=data.lora_request,
            prompt_embeds=data.prompt_embeds,
            mm_features=list(data.mm_features),
        )

    def keep_generator_state(self) -> None:
        if self.generator is not None:
            self.generator_state = self.generator.get_state()

    def drop_discarded_tokens(self, num_tokens: int) -> None:
        """Forget the tokens past the scheduler's ``num_tokens``: under async scheduling a step
        in flight when the request was preempted sampled one, and the scheduler dropped it."""
        if len(self.token_ids) <= num_tokens:
            return
        del self.token_ids[num_tokens:]
        self.error = None  # its logits processor's, raised in that step: the scheduler dropped it
        if self.generator is not None and self.generator_state is not None:
            self.generator.set_state(self.generator_state)

    def advance(self, num_new: int) -> None:
        """Count a step's ``num_new`` tokens as computed, less its drafts not kept: after a step
        that sampled, every token it kept but the last (the next step's input)."""
        self.num_computed_tokens = min(self.num_computed_tokens + num_new, self.num_tokens - 1)

    def add_drafts(self, drafts: list[int]) -> None:
        self.token_ids.extend(drafts)
        self.num_drafts = len(drafts)

    def drop_drafts(self) -> list[int]:
        """Take this step's drafts off the end of token_ids; returns them."""
        if not self.num_drafts:
            return []
        drafts = self.token_ids[-self.num_drafts :]
        del self.token_ids[-self.num_drafts :]
        self.num_drafts = 0
        return drafts

    @property
    def prompt_token_ids(self) -> list[int]:
        # A prompt given as embeddings has none: penalties then see the output alone.
        if self.prompt_embeds is not None:
            return []
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens
