"""Reasoning parsers (``--reasoning-parser``): split ``<think>...</think>`` (or a model's own pair
of tags) out of the output into ``reasoning_content``, whole or while streaming.

- ``deepseek_r1``: the chat template already opens ``<think>``, so the output may start inside
  the reasoning; everything before ``</think>`` is reasoning, and without ``</think>`` all of it is.
  ``glm45`` (GLM-4.5 to 4.7) and ``minimax_m2`` read the same way, ``seed_oss`` too with
  ``<seed:think>...</seed:think>``.
- ``deepseek_v3`` (DeepSeek-V3.1 and later): hybrid; it thinks only when its chat template is told
  to (``chat_template_kwargs`` ``thinking`` or ``enable_thinking``), and then reads as
  ``deepseek_r1``; otherwise the whole output is content, as vLLM's parser reads it.
- ``qwen3``: reasoning only when the output opens with ``<think>``; with thinking disabled
  (``enable_thinking=False``) there is none and everything is content. ``mistral`` (Magistral)
  reads the same way with ``[THINK]...[/THINK]``, ``granite`` (Granite 3.2+) with "Here is my
  thought process:" ... "Here is my response:".
- ``openai_gptoss`` (gpt-oss): the ``analysis`` channel of its harmony output is the reasoning;
  the ``final`` channel (and a preamble) the content; ``harmony.py`` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infernetes.runtime.server.harmony import HarmonyPiece, HarmonyReader, read_harmony
from infernetes.runtime.server.text_stream import find_first, partial_marker_len

THINK_START, THINK_END = "<think>", "</think>"


@dataclass
class ReasoningSplit:
    reasoning: str | None
    content: str | None


class ReasoningParser:
    name = ""
    # The tags (or phrases) that open and close the reasoning; any one of each.
    starts: tuple[str, ...] = (THINK_START,)
    ends: tuple[str, ...] = (THINK_END,)
    # Whether the output counts as reasoning before any start tag is seen.
    starts_in_reasoning = False
    # Whether it reads special tokens, which the output must then keep.
    keeps_special_tokens = False

    def opening(self, stripped: str) -> str | None:
        """The start tag ``stripped`` (the output less leading whitespace) opens with."""
        return next((start for start in self.starts if stripped.startswith(start)), None)

    def close(self, text: str) -> tuple[str, str] | None:
        """``(reasoning, content)`` of reasoning ``text`` once an end tag closes it."""
        found = find_first(text, self.ends)
        if found is None:
            return None
        at, end = found
        return text[:at], text[at + len(end) :]

    def split(self, text: str) -> ReasoningSplit:
        stripped = text.lstrip()
        start = self.opening(stripped)
        if start is not None:
            text = stripped[len(start) :]
        elif not self.starts_in_reasoning:
            return ReasoningSplit(None, text)
        # Without the start tag the reasoning keeps its leading whitespace, as streamed.
        closed = self.close(text)
        if closed is None:
            return ReasoningSplit(text, None)
        return ReasoningSplit(closed[0], closed[1] or None)

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)

    def for_request(self, template_kwargs: Mapping[str, Any]) -> ReasoningParser | None:
        """The parser of a request whose chat template got ``template_kwargs``; None when its
        output holds no reasoning."""
        return self


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    starts_in_reasoning = True


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    name = "deepseek_v3"

    def for_request(self, template_kwargs: Mapping[str, Any]) -> ReasoningParser | None:
        thinking = template_kwargs.get("thinking") or template_kwargs.get("enable_thinking")
        return self if thinking else None


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"


class Glm45ReasoningParser(DeepSeekR1ReasoningParser):
    name = "glm45"


class MiniMaxM2ReasoningParser(DeepSeekR1ReasoningParser):
    # MiniMax-M2's template opens <think>; the model writes only </think>.
    name = "minimax_m2"


class SeedOssReasoningParser(DeepSeekR1ReasoningParser):
    name = "seed_oss"
    starts, ends = ("<seed:think>",), ("</seed:think>",)


class MistralReasoningParser(Qwen3ReasoningParser):
    # Magistral writes [THINK] itself when it reasons.
    name = "mistral"
    starts, ends = ("[THINK]",), ("[/THINK]",)


class GraniteReasoningParser(Qwen3ReasoningParser):
    # Granite 3.2+ with ``thinking=True`` writes phrases, not tags, in either spelling.
    name = "granite"
    starts = ("Here is my thought process:", "Here's my thought process:")
    ends = ("Here is my response:", "Here's my response:")


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
        parser = self.parser
        if not self.opening_checked:
            stripped = self.pending.lstrip()
            if any(len(stripped) < len(s) and s.startswith(stripped) for s in parser.starts):
                return "", ""  # may still become a start tag
            self.opening_checked = True
            start = parser.opening(stripped)
            if start is not None:
                self.pending = stripped[len(start) :]
                self.in_reasoning = True
        if not self.in_reasoning or self.done_reasoning:
            content, self.pending = self.pending, ""
            return "", content
        closed = parser.close(self.pending)
        if closed is not None:
            self.done_reasoning = True
            self.pending = ""
            return closed
        keep = partial_marker_len(self.pending, parser.ends)
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


def _channels(pieces: list[HarmonyPiece]) -> tuple[str, str]:
    """``(reasoning, content)`` of harmony pieces."""
    reasoning = "".join(p.text for p in pieces if p.channel == "analysis")
    return reasoning, "".join(p.text for p in pieces if p.visible)


class GptOssReasoningParser(ReasoningParser):
    name = "openai_gptoss"
    keeps_special_tokens = True

    def split(self, text: str) -> ReasoningSplit:
        reasoning, content = _channels(read_harmony(text)[0])
        return ReasoningSplit(reasoning or None, content or None)

    def stream(self) -> ReasoningStream:
        return HarmonyReasoningStream(self)


class HarmonyReasoningStream(ReasoningStream):
    """The channels of harmony output as they stream."""

    def __init__(self, parser: ReasoningParser) -> None:
        super().__init__(parser)
        self.reader = HarmonyReader()

    def feed(self, piece: str) -> tuple[str, str]:
        return _channels(self.reader.feed(piece))

    def finish(self) -> tuple[str, str]:
        return _channels(self.reader.finish())


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "deepseek_v3": DeepSeekV3ReasoningParser,
    "glm45": Glm45ReasoningParser,
    # GLM-4.7 thinks as GLM-4.5 does.
    "glm47": Glm45ReasoningParser,
    "minimax_m2": MiniMaxM2ReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
    "granite": GraniteReasoningParser,
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
