"""A draft model (vLLM's ``method: "draft_model"``): a smaller model with the target's vocabulary
guesses each request's next tokens greedily, and the target verifies them (``verify.py``).

The draft runs in the same worker over the same paged cache: its attention layers get their own
key and value tensors in the target's block pool, indexed by the request's block ids, so
allocation, prefix caching and preemption serve it unchanged. After each step it computes its
keys and values wherever the target computed its own (a prefill chunk, the accepted drafts) and at
the token just sampled, so a block the prefix cache holds has both models' entries. From there it
feeds its own guesses back one position at a time, writing them into slots the scheduler holds
past the step's tokens (``spec_decode.config.lookahead_tokens``); the target's later steps write
over those positions as they verify them, and the draft's catch-up writes its own again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.model_executor.context import AttentionMetadata, set_attention_metadata
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.loader import build_model
from infernetes.runtime.model_executor.models.llama_eagle3 import aux_layer_ids
from infernetes.runtime.spec_decode.config import HIDDEN_STATE_METHODS
from infernetes.runtime.worker.input_batch import (
    BlockTable,
    StepBuffers,
    StepInputs,
    decode_inputs,
    step_inputs,
)
from infernetes.runtime.worker.request_state import CachedRequestState
from torch import nn


class DraftModelProposer:
    """Proposes up to ``num_speculative_tokens`` greedy tokens of the draft checkpoint for each
    request that sampled; ``block_table`` is the model runner's, which the draft shares. An
    EAGLE head (``method: "eagle"``) is run the same way, with two differences: each position
    takes the token after it with the hidden state before it (the target's, then its own), and
    it uses the ``target``'s embedding and LM head."""

    def __init__(self, config: RuntimeConfig, block_table: BlockTable, target: nn.Module) -> None:
        spec = config.speculative
        assert spec is not None and spec.draft is not None  # resolved by engine_config
        self.k = spec.num_speculative_tokens
        self.shift = 1 if spec.method in HIDDEN_STATE_METHODS else 0
        self.max_model_len = spec.draft.max_model_len  # at most the target's
        self.target_max_model_len = config.model.info.max_model_len
        device = config.device.device
        self.model = build_model(
            spec.draft,
            device,
            config.load.load_format,
            config.load.use_tqdm_on_load,
            config.model.seed or 0,
            ignore_patterns=config.load.ignore_patterns,
        )
        if self.shift:
            self.model.share_target(target.model.embed_tokens, target.lm_head)  # type: ignore[attr-defined, union-attr]  # an EAGLE head; a Llama target
        # EAGLE-3: the input of each of these target layers, kept by a hook in each forward
        self.aux_layers: tuple[int, ...] = ()
        self._aux: dict[int, torch.Tensor] = {}
        if spec.method == "eagle3":
            self.aux_layers = aux_layer_ids(spec.draft.hf_config, len(target.model.layers))  # type: ignore[union-attr, arg-type]  # a Llama target
            for index in self.aux_layers:
                target.model.layers[index].register_forward_pre_hook(self._keep_aux(index))  # type: ignore[union-attr, index]  # a Llama target
        self.attention_layers: list[Attention] = []
        for name, module in self.model.named_modules():
            if isinstance(module, Attention):
                module.layer_name = f"draft.{name}"  # apart from the target's in a KV connector
                self.attention_layers.append(module)
        self.block_table = block_table
        self.block_size = config.cache.block_size
        self.buffers = StepBuffers(device, persistent=device.type != "cpu")

    @torch.inference_mode()
    def propose(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        sampling: Sequence[int],
        hidden: torch.Tensor,
    ) -> list[list[int]]:
        sampled = set(sampling)
        # each request's positions the draft computes: the target's, up to the token just sampled
        # (an EAGLE head's position holds the token after it: one fewer)
        ends = [
            min(
                r.num_tokens - self.shift if i in sampled else r.num_computed_tokens + n,
                self.max_model_len,
            )
            for i, (r, n) in enumerate(zip(batch, num_scheduled, strict=True))
        ]
        catching_up = [i for i, r in enumerate(batch) if ends[i] > r.num_computed_tokens]
        if not catching_up:
            return [[] for _ in sampling]
        lengths = [ends[i] - batch[i].num_computed_tokens for i in catching_up]
        inputs = step_inputs(
            [batch[i] for i in catching_up], lengths, self.block_table, self.block_size, self.shift
        )
        out = self._forward(inputs, self._target_rows(hidden, num_scheduled, catching_up, lengths))
        last_rows = dict(zip(catching_up, np.cumsum(lengths) - 1, strict=True))
        # how many drafts each could verify: the scheduler's room, then the draft's context
        budgets = {
            i: min(
                self.k,
                self.target_max_model_len - batch[i].num_tokens - 1,
                self.max_model_len - batch[i].num_tokens + 1,
            )
            for i in sampling
        }
        drafting = [
            i for i in sampling if budgets[i] > 0 and ends[i] == batch[i].num_tokens - self.shift
        ]
        drafts: dict[int, list[int]] = {i: [] for i in drafting}
        if drafting:
            out = out[torch.as_tensor([int(last_rows[i]) for i in drafting], device=out.device)]
            self._append_guesses(drafts, drafting, out)
        for step in range(1, self.k):
            still = [j for j, i in enumerate(drafting) if budgets[i] > step]
            if not still:
                break
            out = out[torch.as_tensor(still, device=out.device)]
            drafting = [drafting[j] for j in still]
            inputs = decode_inputs(
                np.fromiter((batch[i].row for i in drafting), np.int64, len(drafting)),
                np.fromiter(
                    (batch[i].num_tokens - 1 - self.shift + step for i in drafting), np.int64
                ),
                np.fromiter((drafts[i][-1] for i in drafting), np.int64),
                self.block_table,
                self.block_size,
            )
            out = self._forward(inputs, out)
            self._append_guesses(drafts, drafting, out)
        return [drafts.get(i, []) for i in sampling]

    def _keep_aux(self, index: int) -> Callable[[nn.Module, tuple], None]:
        def keep(module: nn.Module, args: tuple) -> None:
            _, hidden, residual = args  # a decoder layer's (positions, hidden, residual)
            self._aux[index] = hidden if residual is None else hidden + residual

        return keep

    def _target_rows(
        self,
        hidden: torch.Tensor,
        num_scheduled: Sequence[int],
        catching_up: Sequence[int],
        lengths: Sequence[int],
    ) -> torch.Tensor:
        """The target's hidden states at the positions the catch-up computes (EAGLE only)."""
        if not self.shift:
            return hidden
        if self.aux_layers:
            aux = torch.cat([self._aux[i] for i in self.aux_layers], dim=-1)
            hidden = self.model.combine_hidden_states(aux)  # type: ignore[attr-defined]  # an EAGLE-3 head
        starts = np.cumsum([0, *num_scheduled])  # each request's first row of ``hidden``
        rows = np.concatenate(
            [np.arange(starts[i], starts[i] + n) for i, n in zip(catching_up, lengths, strict=True)]
        )
        return hidden[torch.as_tensor(rows, device=hidden.device)]

    def _forward(self, inputs: StepInputs, hidden: torch.Tensor) -> torch.Tensor:
        """The draft's output at ``inputs``; ``hidden`` holds each position's hidden state
        before it (the target's, or the head's own), which only an EAGLE head reads."""
        input_ids, positions, slots, cu_seqlens, seq_lens, tables = self.buffers.stage(inputs)
        set_attention_metadata(
            AttentionMetadata(
                slot_mapping=slots,
                block_tables=tables,
                cu_seqlens_q=cu_seqlens,
                seq_lens=seq_lens,
            )
        )
        try:
            if self.shift:
                return self.model(input_ids, positions, hidden)  # type: ignore[call-arg]  # an EAGLE head takes the hidden states
            return self.model(input_ids, positions)
        finally:
            set_attention_metadata(None)

    def _append_guesses(
        self, drafts: dict[int, list[int]], drafting: Sequence[int], hidden: torch.Tensor
    ) -> None:
        guesses = self.model.compute_logits(hidden).argmax(dim=-1).tolist()
        for i, token in zip(drafting, guesses, strict=True):
            drafts[i].append(token)
