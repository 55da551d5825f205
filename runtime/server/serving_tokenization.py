"""POST /tokenize and /detokenize (vLLM's tokenizer routes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infernetes.runtime.server.chat_template import ChatRenderer
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from infernetes.runtime.server.serving_base import ServingBase

if TYPE_CHECKING:
    from infernetes.runtime.engine.async_engine import AsyncEngine


class TokenizationServing(ServingBase):
    def __init__(self, engine: AsyncEngine, settings: Any, renderer: ChatRenderer) -> None:
        super().__init__(engine, settings)
        self.renderer = renderer

    def tokenize_request(
        self, request: TokenizeCompletionRequest | TokenizeChatRequest
    ) -> TokenizeResponse:
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            text = self.renderer.render(
                request.messages,
                template=request.chat_template,
                tools=[t.model_dump(exclude_none=True) for t in request.tools]
                if request.tools
                else None,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                template_kwargs=request.chat_template_kwargs,
            )
        else:
            text = request.prompt
        tokens = self.tokenize(text, request.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=tokens)

    def detokenize_request(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        self.check_token_ids(request.tokens, "tokens")
        try:
            return DetokenizeResponse(prompt=self.tokenizer.decode(request.tokens))
        except (ValueError, OverflowError) as exc:
            raise APIError(f"tokens cannot be decoded: {exc}", 400, "tokens") from exc
