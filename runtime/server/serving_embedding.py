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

    async def create(self, request: EmbeddingRequest) -> EmbeddingResponse:
        self.check_model(request.model)
        self.check_engine()
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
                vector = vector[: request.dimensions]
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
