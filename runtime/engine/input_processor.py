"""InputProcessor: an API request becomes engine requests, or a ValueError naming the problem.

It tokenizes a text prompt, checks the prompt and the sampling parameters against the model
(vocabulary, context length, ``--max-logprobs``), compiles a structured-output constraint (a bad
one is the error), fills in ``max_tokens`` and the stop tokens, and fans ``n`` out into child
requests that share the prompt (each with its own seed and matcher), gathered under the user's id
by a ``ParentRequest``. Nothing is queued when anything is wrong.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infernetes.runtime.config import ModelConfig
from infernetes.runtime.engine.errors import RequestError
from infernetes.runtime.engine.output_processor import ParentRequest
from infernetes.runtime.engine.request import Request
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.tokenization.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from infernetes.runtime.engine.structured_output import StructuredOutputManager

Prompt = str | Sequence[int]


class InputProcessor:
    def __init__(
        self,
        model: ModelConfig,
        scheduling_policy: str,
        tokenizer: Any,
        grammars: StructuredOutputManager,
    ) -> None:
        self.model = model
        self.scheduling_policy = scheduling_policy
        self.tokenizer = tokenizer
        self.grammars = grammars
        self._arrivals = itertools.count()

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.model.default_sampling_params)

    def process(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None,
        priority: int = 0,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> ParentRequest:
        if self.scheduling_policy != "priority" and priority != 0:
            raise ValueError("priority is only allowed with --scheduling-policy priority")
        text, ids = self._tokenize(prompt)
        self._check_prompt(ids)
        if self.model.is_pooling:
            children = [self._request(request_id, ids, None, text, priority, lora=lora_request)]
            parent = ParentRequest(request_id, text, ids, None, children)
        else:
            if params is None:
                params = self.default_sampling_params()
            if not isinstance(params, SamplingParams):
                raise TypeError(
                    f"sampling params must be a SamplingParams, got {type(params).__name__}"
                )
            params = self._check_params(params, len(ids))
            children = [
                self._child(request_id, index, ids, params, text, priority, lora_request)
                for index in range(params.n)
            ]
            if params.structured_outputs is not None:
                # Compiled once per request; each sequence advances a copy of its own.
                grammar = self.grammars.compile(params.structured_outputs)
                for child in children:
                    child.grammar = grammar if child is children[0] else grammar.copy()
            parent = ParentRequest(request_id, text, ids, params, children)
        if arrival_time is not None:
            for child in children:
                child.times.arrival_wall = arrival_time
        return parent

    # -- prompt --------------------------------------------------------------------------------

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "a text prompt needs a tokenizer; the engine runs with --skip-tokenizer-init"
                )
            return prompt, list(self.tokenizer(prompt).input_ids)
        ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_token_ids must be a list of integers")
        return None, ids

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("The prompt cannot be empty.")
        vocab = self.model.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"Token id {bad[0]} is out of vocabulary (the vocabulary size is {vocab})."
            )
        max_model_len = self.model.max_model_len
        if len(ids) > max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {max_model_len}."
            )

    # -- sampling parameters -------------------------------------------------------------------

    def _check_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        cap = self.model.max_logprobs  # -1: no cap, as in vLLM
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and 0 <= cap < value:
                raise RequestError(
                    f"Requested {name} of {value}, which is greater than the maximum allowed "
                    f"(--max-logprobs): {cap}.",
                    name,
                )
        vocab = self.model.vocab_size
        for name, ids in (
            ("logit_bias", list(params.logit_bias or {})),
            ("allowed_token_ids", params.allowed_token_ids or []),
            ("stop_token_ids", params.stop_token_ids or []),
        ):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"{name} contains token id {bad[0]}, outside the vocabulary [0, {vocab})."
                )
        params = params.clone()
        self._settle_max_tokens(params, prompt_len)
        if (
            params.stop or params.logprobs is not None or params.detokenize
        ) and self.tokenizer is None:
            params.detokenize = False
            if params.stop:
                raise ValueError(
                    "stop strings need a tokenizer; the engine runs with --skip-tokenizer-init"
                )
        if not params.ignore_eos:
            params.all_stop_token_ids |= self.model.extra_eos_token_ids
        return params

    def _settle_max_tokens(self, params: SamplingParams, prompt_len: int) -> None:
        max_model_len = self.model.max_model_len
        if params.max_tokens is None:
            params.max_tokens = max_model_len - prompt_len
            if params.max_tokens < 1:
                raise ValueError(
                    f"The prompt (length {prompt_len}) leaves no room to generate within the "
                    f"maximum model length of {max_model_len}."
                )
        elif prompt_len + params.max_tokens > max_model_len:
            raise ValueError(
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the prompt, "
                f"{params.max_tokens} in the completion). Please reduce the length of the prompt "
                "or max_tokens."
            )

    # -- requests ------------------------------------------------------------------------------

    def _request(
        self,
        request_id: str,
        ids: list[int],
        params: SamplingParams | None,
        text: str | None,
        priority: int,
        parent_id: str | None = None,
        index: int = 0,
        lora: LoRARequest | None = None,
    ) -> Request:
        return Request(
            request_id,
            ids,
            params,
            prompt=text,
            eos_token_id=self.model.eos_token_id,
            priority=priority,
            arrival_order=next(self._arrivals),
            parent_id=parent_id,
            index=index,
            pooling=params is None,
            lora_request=lora,
        )

    def _child(
        self,
        request_id: str,
        index: int,
        ids: list[int],
        params: SamplingParams,
        text: str | None,
        priority: int,
        lora: LoRARequest | None = None,
    ) -> Request:
        """Sample ``index`` of ``n``: its own id and seed; prompt logprobs come with the first."""
        if params.n > 1:
            params = params.clone()
            request_id, parent_id = f"{index}_{request_id}", request_id
            if index > 0:
                params.prompt_logprobs = None
                if params.seed is not None:
                    params.seed += index
        else:
            parent_id = request_id
        child = self._request(request_id, ids, params, text, priority, parent_id, index, lora)
        if self.tokenizer is not None and params.detokenize:
            child.detokenizer = IncrementalDetokenizer(
                self.tokenizer,
                ids,
                list(params.stop or ()),
                params.include_stop_str_in_output,
                params.skip_special_tokens,
                params.spaces_between_special_tokens,
            )
        if params.logprobs is not None:
            child.logprobs = []
        if params.prompt_logprobs is not None:
            child.prompt_logprobs = [None]
        return child
