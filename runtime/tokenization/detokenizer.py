"""Incremental detokenization with stop strings.

Text is decoded from a sliding window of token ids (a few tokens of context before the new ones,
so spacing comes out as a full decode would); a window whose text ends in U+FFFD is an incomplete
multi-byte character and waits for the next token. Stop strings are searched only where new text
could complete one; while unfinished, the last ``max(len(stop)) - 1`` characters are held back so
a stop string is never streamed out before it is recognised.
"""

from __future__ import annotations

from typing import Any

# Prompt tokens decoded as context before the first output token.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        stop: list[str],
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.token_ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.output_text = ""
        self.stop_buffer = max((len(s) for s in stop), default=1) - 1 if stop else 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def add_token(self, token_id: int) -> str:
        """Append a token; returns the text it completed (maybe empty)."""
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        new_text = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.output_text += new_text
        return new_text

    def find_stop(self, num_new_chars: int) -> str | None:
        """The stop string the last ``num_new_chars`` characters completed; the text is cut there."""
        if not self.stop or num_new_chars == 0:
            return None
        for stop in self.stop:
            start = max(0, len(self.output_text) - num_new_chars - len(stop) + 1)
            index = self.output_text.find(stop, start)
            if index != -1:
                end = index + len(stop) if self.include_stop else index
                self.output_text = self.output_text[:end]
                return stop
        return None

    def text(self, finished: bool) -> str:
        """The output text safe to show: while unfinished, without a possible stop-string start."""
        if finished or not self.stop_buffer:
            return self.output_text
        return self.output_text[: max(0, len(self.output_text) - self.stop_buffer)]
