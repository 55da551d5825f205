"""OutputProcessor: request state becomes RequestOutputs: cumulative, delta (streaming) or
final-only, with the ``n`` samples of a request gathered under the user's request id. It owns the
user's requests (``ParentRequest``) from when they are queued (``add`` fans a prepared request out
into its ``n`` samples) until their final output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infernetes.runtime.engine.messages import EngineCoreRequest
from infernetes.runtime.engine.request import Request
from infernetes.runtime.model_executor.sampler import TopLogprobs
from infernetes.runtime.outputs import (
    CompletionOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from infernetes.runtime.sampling_params import RequestOutputKind, SamplingParams
from infernetes.runtime.tokenization.detokenizer import IncrementalDetokenizer


@dataclass
class _Sent:
    """How much of a sample was already handed out (for DELTA outputs)."""

    tokens: int = 0
    text: int = 0
    finished: bool = False


@dataclass
class ParentRequest:
    """The user's request: ``n`` child Requests sharing one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams | None
    children: list[Request]
    sent: dict[int, _Sent] = field(default_factory=dict)
    prompt_logprobs_sent: bool = False
    # The children's logprobs as vLLM's dicts, converted once as they arrive (by child index).
    logprobs: dict[int, list[dict[int, Logprob]]] = field(default_factory=dict)
    prompt_logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(child.is_finished for child in self.children)


def _request(
    request: EngineCoreRequest,
    params: SamplingParams | None,
    eos_token_id: int | None,
    arrival_order: int,
    request_id: str | None = None,
    parent_id: str | None = None,
    index: int = 0,
) -> Request:
    return Request(
        request_id or request.request_id,
        request.prompt_token_ids,
        params,
        prompt=request.prompt,
        eos_token_id=eos_token_id,
        priority=request.priority,
        arrival_order=arrival_order,
        parent_id=parent_id,
        index=index,
        pooling=params is None,
        lora_request=request.lora_request,
        prompt_embeds=request.prompt_embeds,
        prompt_embeds_digest=request.prompt_embeds_digest,
        mm_features=request.mm_features,
    )


def _metrics(request: Request) -> RequestMetrics:
    t = request.times

    def wall(moment: float | None) -> float | None:
        return None if moment is None else t.arrival_wall + (moment - t.arrival)

    return RequestMetrics(
        arrival_time=t.arrival_wall,
        last_token_time=wall(t.last_token) or t.arrival_wall,
        first_scheduled_time=wall(t.scheduled),
        first_token_time=wall(t.first_token),
        time_in_queue=(t.scheduled - t.arrival) if t.scheduled is not None else None,
        finished_time=wall(t.finished),
        num_cached_tokens=max(request.num_cached_tokens, 0),
    )


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentRequest] = {}
        self._decoded: dict[int, str] = {}

    def add(
        self, request: EngineCoreRequest, eos_token_id: int | None, arrival_order: int
    ) -> ParentRequest:
        """Take a prepared request: ``n`` child Requests (each with its own id and seed) under the
        user's id; the returned parent's children are for the scheduler."""
        params = request.params
        if params is None:  # a pooling request
            children = [_request(request, None, eos_token_id, arrival_order)]
        else:
            children = [
                self._child(request, params, index, eos_token_id, arrival_order)
                for index in range(params.n)
            ]
        if request.arrival_time is not None:
            for child in children:
                child.times.arrival_wall = request.arrival_time
        # A prompt given as embeddings has no token ids to report, only placeholders.
        ids = request.prompt_token_ids if request.prompt_embeds is None else []
        parent = ParentRequest(request.request_id, request.prompt, ids, params, children)
        self.parents[parent.request_id] = parent
        return parent

    def _child(
        self,
        request: EngineCoreRequest,
        params: SamplingParams,
        index: int,
        eos_token_id: int | None,
        arrival_order: int,
    ) -> Request:
        """Sample ``index`` of ``n``: its own id and seed; prompt logprobs come with the first."""
        request_id, parent_id = request.request_id, request.request_id
        if params.n > 1:
            params = params.clone()
            request_id = f"{index}_{request_id}"
            if index > 0:
                params.prompt_logprobs = None
                if params.seed is not None:
                    params.seed += index
        child = _request(request, params, eos_token_id, arrival_order, request_id, parent_id, index)
        if self.tokenizer is not None and params.detokenize:
            child.detokenizer = IncrementalDetokenizer(
                self.tokenizer,
                [] if request.prompt_embeds is not None else request.prompt_token_ids,
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

    def has_unfinished(self) -> bool:
        return bool(self.parents)

    def process(self, updated: Sequence[Request]) -> list[RequestOutput | PoolingRequestOutput]:
        """The outputs of the user's requests that ``updated`` (requests with something new this
        step) belong to; a request whose samples have all finished is handed over for good."""
        touched: dict[str, ParentRequest] = {}
        for request in updated:
            parent = self.parents.get(request.parent_id)
            if parent is not None:
                touched[parent.request_id] = parent
        outputs = []
        for parent in touched.values():
            output = self.build(parent)
            if output is not None:
                outputs.append(output)
            if parent.finished:
                del self.parents[parent.request_id]
        return outputs

    def pop(self, request_id: str) -> ParentRequest | None:
        return self.parents.pop(request_id, None)

    def decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._decoded.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            self._decoded[token_id] = text
        return text

    def logprob_dict(self, top: TopLogprobs) -> dict[int, Logprob]:
        """The chosen token first, then the top-k by rank, as vLLM lists them."""
        entries = {top.token_id: Logprob(top.logprob, top.rank, self.decode_token(top.token_id))}
        for rank, (token_id, logprob) in enumerate(
            zip(top.top_ids, top.top_logprobs, strict=True), 1
        ):
            if token_id not in entries:
                entries[token_id] = Logprob(logprob, rank, self.decode_token(token_id))
        return entries

    def build(
        self, parent: ParentRequest, force_final: bool = False
    ) -> RequestOutput | PoolingRequestOutput | None:
        first = parent.children[0]
        if first.pooling:
            if not first.is_finished:
                return None
            return PoolingRequestOutput(
                parent.request_id,
                PoolingOutput(first.pooled),
                parent.prompt_token_ids,
                True,
                parent.prompt,
                _metrics(first),
            )
        assert parent.params is not None  # a generative request
        kind = parent.params.output_kind
        finished = parent.finished
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        completions = []
        for child in parent.children:
            completion = self._completion(
                parent, child, kind == RequestOutputKind.DELTA, force_final
            )
            if completion is not None:
                completions.append(completion)
        if not completions and not finished:
            return None
        prompt_logprobs = self._prompt_logprobs(parent, first)
        if kind == RequestOutputKind.DELTA:
            if parent.prompt_logprobs_sent:
                prompt_logprobs = None
            parent.prompt_logprobs_sent = True
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            outputs=completions,
            finished=finished,
            metrics=_metrics(first),
            num_cached_tokens=max(first.num_cached_tokens, 0),
            kv_transfer_params=first.kv_transfer_params if finished else None,
        )

    def _logprobs(self, parent: ParentRequest, child: Request) -> list[dict[int, Logprob]] | None:
        if child.logprobs is None:
            return None
        converted = parent.logprobs.setdefault(child.index, [])
        converted.extend(self.logprob_dict(top) for top in child.logprobs[len(converted) :])
        return converted

    def _prompt_logprobs(
        self, parent: ParentRequest, first: Request
    ) -> list[dict[int, Logprob] | None] | None:
        if first.prompt_logprobs is None:
            return None
        converted = parent.prompt_logprobs
        for top in first.prompt_logprobs[len(converted) :]:
            converted.append(None if top is None else self.logprob_dict(top))  # the first is None
        return converted

    def _completion(
        self, parent: ParentRequest, child: Request, delta: bool, force: bool
    ) -> CompletionOutput | None:
        finished = child.is_finished
        text = child.detokenizer.text(finished) if child.detokenizer is not None else ""
        tokens = child.output_token_ids
        logprobs = self._logprobs(parent, child)
        if delta:
            sent = parent.sent.setdefault(child.index, _Sent())
            new_finish = finished and not sent.finished
            if (
                len(tokens) == sent.tokens
                and len(text) == sent.text
                and not new_finish
                and not force
            ):
                return None
            new_tokens, new_text = tokens[sent.tokens :], text[sent.text :]
            new_logprobs = logprobs[sent.tokens :] if logprobs is not None else None
            sent.tokens, sent.text, sent.finished = len(tokens), len(text), finished
            tokens, text, logprobs = new_tokens, new_text, new_logprobs
        return CompletionOutput(
            index=child.index,
            text=text,
            token_ids=list(tokens),
            cumulative_logprob=child.cumulative_logprob if child.logprobs is not None else None,
            logprobs=list(logprobs) if logprobs is not None else None,
            finish_reason=child.status.finish_reason,
            stop_reason=child.stop_reason,
        )
