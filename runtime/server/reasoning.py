"""Reasoning parsers (``--reasoning-parser``): split ``<think>...</think>`` out of the output into
``reasoning_content``, whole or while streaming.

- ``deepseek_r1``: the chat template already opens ``<think>``, so the output may start inside
  the reasoning; everything before ``</think>`` is reasoning, and without ``</think>`` all of it is.
- ``qwen3``: reasoning only when the output opens with ``<think>``; with thinking disabled
  (``enable_thinking=False``) there is none and everything is content.
"""

from __future__ import annotations

from dataclasses import dataclass

from infernetes.runtime.server.text_stream import partial_marker_len

THINK_START, THINK_END = "<think>", "</think>"


@dataclass
class ReasoningSplit:
    reasoning: str | None
    content: str | None


class ReasoningParser:
    name = ""
    # Whether the output counts as reasoning before any <think> tag is seen.
    starts_in_reasoning = False

    def split(self, text: str) -> ReasoningSplit:
        stripped = text.lstrip()
        opened = stripped.startswith(THINK_START)
        if opened:
            stripped = stripped[len(THINK_START) :]
        elif not self.starts_in_reasoning:
            return ReasoningSplit(None, text)
        reasoning, closed, content = stripped.partition(THINK_END)
        if not closed:
            return ReasoningSplit(reasoning, None)
        return ReasoningSplit(reasoning, content or None)

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    starts_in_reasoning = True


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"


class ReasoningStream:
    """Feeds output pieces; returns ``(reasoning_delta, content_delta)`` for each."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.pending = ""
        self.opening_checked = False
        self.in_reasoning = parser.starts_in_reasoning
        self.done_reasoning = False

    def feed(self, piece: str) -> tuple[str, str]:
        self.pending += piece
        if not self.opening_checked:
            stripped = self.pending.lstrip()
            if len(stripped) < len(THINK_START) and THINK_START.startswith(stripped):
                return "", ""  # may still become <think>
            self.opening_checked = True
            if stripped.startswith(THINK_START):
                self.pending = stripped[len(THINK_START) :]
                self.in_reasoning = True
        if not self.in_reasoning or self.done_reasoning:
            content, self.pending = self.pending, ""
            return "", content
        reasoning, closed, content = self.pending.partition(THINK_END)
        if closed:
            self.done_reasoning = True
            self.pending = ""
            return reasoning, content
        keep = partial_marker_len(self.pending, (THINK_END,))
        reasoning, self.pending = (
            self.pending[: len(self.pending) - keep],
            self.pending[len(self.pending) - keep :],
        )
        return reasoning, ""

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.in_reasoning and not self.done_reasoning:
            return rest, ""
        return "", rest


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}


def make_reasoning_parser(name: str) -> ReasoningParser:
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"--reasoning-parser {name!r} is not supported yet; supported: "
            f"{', '.join(sorted(REASONING_PARSERS))}"
        )
    return REASONING_PARSERS[name]()
