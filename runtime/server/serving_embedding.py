"""POST /v1/embeddings and /pooling, for models served with ``--task embed``."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingRequest,
    PoolingResponse,
    UsageInfo,
    random_id,
)
from infernetes.runtime.server.serving_base import ServingBase, batch_items


class EmbeddingServing(ServingBase):
    def _inputs(self, request: EmbeddingRequest) -> list[list[int]]:
        items = batch_items(request.input)
        token_lists = []
        for i, item in enumerate(items):
            param = "input" if len(items) == 1 else f"input[{i}]"
            if isinstance(item, str):
                ids = self.tokenize(item, True, request.truncate_prompt_tokens)
            else:
                ids = self.check_token_ids(list(item), param)
            if not ids:
                raise APIError(f"{param} must not be empty", 400, param)
            if len(ids) > self.max_model_len:
                raise APIError(
                    f"This model's maximum context length is {self.max_model_len} "
                    f"tokens. However, you requested {len(ids)} tokens in the input "
                    "for embedding generation. Please reduce the length of the input.",
                    400,
                    param,
                )
            token_lists.append(ids)
        return token_lists

    def _check_dimensions(self, dimensions: int | None) -> None:
        """vLLM's rule: ``dimensions`` only for Matryoshka-trained models (elsewhere a truncated
        vector means little), and one of the sizes the model was trained for when it names
        them."""
        if dimensions is None:
            return
        facts = getattr(self.engine, "model_config", None)
        if not getattr(facts, "is_matryoshka", False):
            raise APIError(
                "Model does not support matryoshka representation, changing output dimensions "
                "will lead to poor results (dimensions must be unset)",
                400,
                "dimensions",
            )
        allowed = getattr(facts, "matryoshka_dimensions", None)
        if allowed and dimensions not in allowed:
            raise APIError(
                f"Model only supports {list(allowed)} matryoshka dimensions, use other output "
                f"dimensions will lead to poor results (got {dimensions})",
                400,
                "dimensions",
            )

    async def create(self, request: EmbeddingRequest) -> EmbeddingResponse:
        self.check_model(request.model)
        self.check_engine()
        self._check_dimensions(request.dimensions)
        token_lists = await off_loop(self._inputs, request)
        request_id = random_id("embd")
        try:
            results = await asyncio.gather(
                *[self.engine.encode(ids, f"{request_id}-{i}") for i, ids in enumerate(token_lists)]
            )
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), 400) from exc
        except RuntimeError as exc:  # EngineDeadError and the like
            raise APIError(f"the engine cannot serve this request: {exc}", 503) from exc
        data = []
        for i, result in enumerate(results):
            vector = np.asarray(result.outputs.embedding, dtype=np.float32)
            if request.dimensions is not None:
                if request.dimensions > vector.shape[-1]:
                    raise APIError(
                        f"dimensions must be at most {vector.shape[-1]}, got {request.dimensions}",
                        400,
                        "dimensions",
                    )
                vector = _truncated(vector, request.dimensions)
            embedding: list[float] | str = (
                base64.b64encode(vector.tobytes()).decode()
                if request.encoding_format == "base64"
                else vector.tolist()
            )
            data.append(EmbeddingData(index=i, embedding=embedding))
        prompt_tokens = sum(len(ids) for ids in token_lists)
        return EmbeddingResponse(
            id=request_id,
            model=request.model or self.settings.model_name,
            data=data,
            usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )

    async def pool(self, request: PoolingRequest) -> PoolingResponse:
        """vLLM's /pooling: what the model's pooler gives, the embedding for embedding models."""
        embedded = await self.create(request)
        return PoolingResponse(
            id=embedded.id.replace("embd-", "pool-", 1),
            created=embedded.created,
            model=embedded.model,
            data=[PoolingData(index=item.index, data=item.embedding) for item in embedded.data],
            usage=embedded.usage,
        )


def _truncated(vector: np.ndarray, dimensions: int) -> np.ndarray:
    """The leading ``dimensions``, normalized again when the pooler normalized the whole vector:
    vLLM truncates before it normalizes, and normalizing a truncated unit vector gives the same."""
    whole_norm = float(np.linalg.norm(vector))
    head = vector[:dimensions]
    if abs(whole_norm - 1.0) < 1e-4:
        head_norm = float(np.linalg.norm(head))
        if head_norm > 0:
            head = head / head_norm
    return head
