"""Engine logprobs (per position ``{token_id: Logprob}``) -> the OpenAI completions and chat
shapes. Tokens print as text, or as ``token_id:<id>`` with --return-tokens-as-token-ids."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from infernetes.runtime.server.protocol import (
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)


def _finite(value: float) -> float:
    # JSON has no -inf; OpenAI clients expect a number. -9999.0 is vLLM's stand-in.
    return value if math.isfinite(value) else -9999.0


class LogprobFormatter:
    def __init__(self, tokenizer: Any, as_token_ids: bool) -> None:
        self.tokenizer = tokenizer
        self.as_token_ids = as_token_ids

    def token_text(self, token_id: int, decoded: str | None) -> str:
        if self.as_token_ids:
            return f"token_id:{token_id}"
        if decoded is not None:
            return decoded
        return self.tokenizer.decode([token_id])

    def _top(self, position: dict[int, Any], count: int) -> list[tuple[int, Any]]:
        ranked = sorted(position.items(), key=lambda item: -item[1].logprob)
        return ranked[:count]

    def completion(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[dict[int, Any] | None],
        count: int,
        text_offset_start: int = 0,
    ) -> CompletionLogprobs:
        out = CompletionLogprobs()
        offset = text_offset_start
        for token_id, position in zip(token_ids, logprobs, strict=False):
            if position is None:  # the first prompt token has no logprob
                text = self.token_text(token_id, None)
                out.tokens.append(text)
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
            else:
                chosen = position.get(token_id)
                text = self.token_text(token_id, getattr(chosen, "decoded_token", None))
                out.tokens.append(text)
                out.token_logprobs.append(_finite(chosen.logprob) if chosen else None)
                out.top_logprobs.append(
                    {
                        self.token_text(tid, lp.decoded_token): _finite(lp.logprob)
                        for tid, lp in self._top(position, count)
                    }
                    if count
                    else {}
                )
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def chat(
        self, token_ids: list[int], logprobs: list[dict[int, Any]], count: int
    ) -> list[ChatTokenLogprob]:
        content = []
        for token_id, position in zip(token_ids, logprobs, strict=False):
            chosen = position.get(token_id)
            text = self.token_text(token_id, getattr(chosen, "decoded_token", None))
            content.append(
                ChatTokenLogprob(
                    token=text,
                    logprob=_finite(chosen.logprob) if chosen else -9999.0,
                    bytes=list(text.encode("utf-8", errors="replace")),
                    top_logprobs=[
                        TopLogprob(
                            token=(t := self.token_text(tid, lp.decoded_token)),
                            logprob=_finite(lp.logprob),
                            bytes=list(t.encode("utf-8", errors="replace")),
                        )
                        for tid, lp in self._top(position, count)
                    ],
                )
            )
        return content
