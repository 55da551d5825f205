"""Reasoning parsers (``--reasoning-parser``): split ``<think>...</think>`` (or a model's own pair
of tags) out of the output into ``reasoning_content``, whole or while streaming.

- ``deepseek_r1``: the chat template already opens ``<think>``, so the output may start inside
  the reasoning; everything before ``</think>`` is reasoning, and without ``</think>`` all of it is.
  ``glm45`` (GLM-4.5 to 4.7) and ``minimax_m2`` read the same way, ``seed_oss`` too with
  ``<seed:think>...</seed:think>``.
- ``qwen3``: reasoning only when the output opens with ``<think>``; with thinking disabled
  (``enable_thinking=False``) there is none and everything is content. ``mistral`` (Magistral)
  reads the same way with ``[THINK]...[/THINK]``.
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
    start, end = THINK_START, THINK_END
    # Whether the output counts as reasoning before any start tag is seen.
    starts_in_reasoning = False

    def split(self, text: str) -> ReasoningSplit:
        stripped = text.lstrip()
        if stripped.startswith(self.start):
            text = stripped[len(self.start) :]
        elif not self.starts_in_reasoning:
            return ReasoningSplit(None, text)
        # Without the start tag the reasoning keeps its leading whitespace, as streamed.
        reasoning, closed, content = text.partition(self.end)
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


class Glm45ReasoningParser(DeepSeekR1ReasoningParser):
    name = "glm45"


class MiniMaxM2ReasoningParser(DeepSeekR1ReasoningParser):
    # MiniMax-M2's template opens <think>; the model writes only </think>.
    name = "minimax_m2"


class SeedOssReasoningParser(DeepSeekR1ReasoningParser):
    name = "seed_oss"
    start, end = "<seed:think>", "</seed:think>"


class MistralReasoningParser(Qwen3ReasoningParser):
    # Magistral writes [THINK] itself when it reasons.
    name = "mistral"
    start, end = "[THINK]", "[/THINK]"


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
        start, end = self.parser.start, self.parser.end
        if not self.opening_checked:
            stripped = self.pending.lstrip()
            if len(stripped) < len(start) and start.startswith(stripped):
                return "", ""  # may still become the start tag
            self.opening_checked = True
            if stripped.startswith(start):
                self.pending = stripped[len(start) :]
                self.in_reasoning = True
        if not self.in_reasoning or self.done_reasoning:
            content, self.pending = self.pending, ""
            return "", content
        reasoning, closed, content = self.pending.partition(end)
        if closed:
            self.done_reasoning = True
            self.pending = ""
            return reasoning, content
        keep = partial_marker_len(self.pending, (end,))
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
    "glm45": Glm45ReasoningParser,
    # GLM-4.7 thinks as GLM-4.5 does.
    "glm47": Glm45ReasoningParser,
    "minimax_m2": MiniMaxM2ReasoningParser,
    "mistral": MistralReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "seed_oss": SeedOssReasoningParser,
}


def make_reasoning_parser(name: str) -> ReasoningParser:
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"--reasoning-parser {name!r} is not supported yet; supported: "
            f"{', '.join(sorted(REASONING_PARSERS))}"
        )
    return REASONING_PARSERS[name]()
