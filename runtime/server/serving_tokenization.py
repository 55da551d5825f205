"""POST /tokenize and /detokenize, GET /tokenizer_info (vLLM's tokenizer routes)."""

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


# init_kwargs naming files on the server's disk: nothing a client can use.
_LOCAL_KEYS = frozenset(
    {"name_or_path", "vocab_file", "merges_file", "tokenizer_file", "special_tokens_map_file"}
)


def _plain(value: Any) -> Any:
    """A tokenizer setting as JSON: AddedTokens as their text, anything else unknown as str."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(getattr(value, "content", value))


class TokenizationServing(ServingBase):
    def __init__(self, engine: AsyncEngine, settings: Any, renderer: ChatRenderer) -> None:
        super().__init__(engine, settings)
        self.renderer = renderer

    def _chat_tokens(self, request: TokenizeChatRequest) -> list[int]:
        prompt = self.chat_prompt(
            self.renderer,
            request.messages,
            add_special_tokens=request.add_special_tokens,
            template=request.chat_template,
            tools=[t.model_dump(exclude_none=True) for t in request.tools or []] or None,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            template_kwargs=request.chat_template_kwargs,
            processor_kwargs=request.mm_processor_kwargs,
        )
        return prompt if isinstance(prompt, list) else prompt.prompt_token_ids

    def tokenize_request(
        self, request: TokenizeCompletionRequest | TokenizeChatRequest
    ) -> TokenizeResponse:
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            tokens = self._chat_tokens(request)
        else:
            tokens = self.tokenize(request.prompt, request.add_special_tokens)
        strings = (
            self.tokenizer.convert_ids_to_tokens(tokens) if request.return_token_strs else None
        )
        return TokenizeResponse(
            count=len(tokens), max_model_len=self.max_model_len, tokens=tokens, token_strs=strings
        )

    def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's /tokenizer_info: the tokenizer's class, its settings (special tokens as their
        text) and the chat template the server renders with, for clients that tokenize remotely
        (lm-eval's ``tokenizer_backend=remote``)."""
        info = {
            key: _plain(value)
            for key, value in getattr(self.tokenizer, "init_kwargs", {}).items()
            if not key.startswith("_") and key not in _LOCAL_KEYS
        }
        for name in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token"):
            value = getattr(self.tokenizer, name, None)
            if value is not None:
                info[name] = str(value)
        info["tokenizer_class"] = type(self.tokenizer).__name__
        if self.renderer.default_template:
            info["chat_template"] = self.renderer.default_template
        return info

    def detokenize_request(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        self.check_token_ids(request.tokens, "tokens")
        try:
            return DetokenizeResponse(prompt=self.tokenizer.decode(request.tokens))
        except (ValueError, OverflowError) as exc:
            raise APIError(f"tokens cannot be decoded: {exc}", 400, "tokens") from exc
