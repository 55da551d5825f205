"""POST /score, /rerank and /classify, for cross-encoders (``*ForSequenceClassification``).

The model gives one row of classifier logits per prompt; a text pair is one prompt, written by the
tokenizer as the model was trained (``[CLS] a [SEP] b [SEP]``). A one-label model's score is the
sigmoid of its logit, as sentence-transformers' CrossEncoder and vLLM give it; classes are the
softmax over several labels.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.protocol import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    UsageInfo,
    random_id,
)
from infernetes.runtime.server.serving_base import ServingBase, batch_items


def probabilities(logits: np.ndarray) -> np.ndarray:
    """One label: its sigmoid; several: the softmax over them (numpy: the API process has no
    torch)."""
    logits = logits.astype(np.float32)
    if logits.size == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: one text_1 against every text_2, or the two lists side by side."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if not firsts or not seconds:
        raise APIError(
            "text_1 and text_2 must not be empty", 400, "text_1" if not firsts else "text_2"
        )
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise APIError(
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, or as "
            "many as text_2",
            400,
            "text_2",
        )
    return list(zip(firsts, seconds, strict=True))


class ScoreServing(ServingBase):
    def _pair_ids(
        self, text_pairs: list[tuple[str, str]], truncate: int | None, param: str
    ) -> list[list[int]]:
        prompts = []
        for first, second in text_pairs:
            ids = list(self.tokenizer(first, second)["input_ids"])
            prompts.append(self._fit(ids[-truncate:] if truncate else ids, param))
        return prompts

    def _fit(self, ids: list[int], param: str) -> list[int]:
        if len(ids) > self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(ids)} tokens in the input. Please reduce the length of the "
                "input.",
                400,
                param,
            )
        return ids

    async def _logits(self, prompts: list[list[int]], prefix: str) -> list[np.ndarray]:
        self.check_engine()
        request_id = random_id(prefix)
        try:
            results = await asyncio.gather(
                *[self.engine.encode(ids, f"{request_id}-{i}") for i, ids in enumerate(prompts)]
            )
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), 400) from exc
        except RuntimeError as exc:  # EngineDeadError and the like
            raise APIError(f"the engine cannot serve this request: {exc}", 503) from exc
        return [np.asarray(result.outputs.data) for result in results]

    def _single_label(self) -> None:
        labels = getattr(getattr(self.engine, "model_config", None), "num_labels", 1)
        if labels != 1:
            raise APIError(
                f"this model classifies into {labels} labels; /score and /rerank need a "
                "one-label cross-encoder (use /classify)",
                400,
                "model",
            )

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        self.check_model(request.model)
        self._single_label()
        text_pairs = pairs(request.text_1, request.text_2)
        prompts = await off_loop(
            self._pair_ids, text_pairs, request.truncate_prompt_tokens, "text_2"
        )
        logits = await self._logits(prompts, "score")
        tokens = sum(len(p) for p in prompts)
        return ScoreResponse(
            model=request.model or self.settings.model_name,
            data=[
                ScoreData(index=i, score=float(probabilities(row)[0]))
                for i, row in enumerate(logits)
            ],
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )

    async def rerank(self, request: RerankRequest) -> RerankResponse:
        self.check_model(request.model)
        self._single_label()
        text_pairs = [(request.query, document) for document in request.documents]
        prompts = await off_loop(
            self._pair_ids, text_pairs, request.truncate_prompt_tokens, "documents"
        )
        logits = await self._logits(prompts, "rerank")
        results = [
            RerankResult(
                index=i,
                document=RerankDocument(text=request.documents[i])
                if request.return_documents
                else None,
                relevance_score=float(probabilities(row)[0]),
            )
            for i, row in enumerate(logits)
        ]
        results.sort(key=lambda r: r.relevance_score, reverse=True)
        if request.top_n:
            results = results[: request.top_n]
        return RerankResponse(
            model=request.model or self.settings.model_name,
            usage=RerankUsage(total_tokens=sum(len(p) for p in prompts)),
            results=results,
        )

    def _inputs(self, request: ClassificationRequest) -> list[list[int]]:
        items = batch_items(request.input)
        prompts = []
        for i, item in enumerate(items):
            param = "input" if len(items) == 1 else f"input[{i}]"
            if isinstance(item, str):
                ids = self.tokenize(item, True, request.truncate_prompt_tokens)
            else:
                ids = self.check_token_ids(list(item), param)
            if not ids:
                raise APIError(f"{param} must not be empty", 400, param)
            prompts.append(self._fit(ids, param))
        return prompts

    async def classify(self, request: ClassificationRequest) -> ClassificationResponse:
        self.check_model(request.model)
        prompts = await off_loop(self._inputs, request)
        logits = await self._logits(prompts, "classify")
        names: dict[Any, str] = getattr(self.engine.model_config, "id2label", None) or {}
        data = []
        for i, row in enumerate(logits):
            probs = probabilities(row)
            best = int(np.argmax(probs)) if probs.size > 1 else int(probs[0] > 0.5)
            data.append(
                ClassificationData(
                    index=i,
                    label=names.get(best, names.get(str(best))),
                    probs=probs.tolist(),
                    num_classes=probs.size,
                )
            )
        tokens = sum(len(p) for p in prompts)
        return ClassificationResponse(
            model=request.model or self.settings.model_name,
            data=data,
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )
