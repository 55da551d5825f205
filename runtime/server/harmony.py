"""gpt-oss's harmony format, read with ``openai-harmony`` as vLLM reads it.

The output is a run of messages, each ``<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]
<|message|>TEXT`` closed by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (the next opens with
``<|start|>assistant``): ``analysis`` is the reasoning, ``final`` the answer, and a ``commentary``
message to ``functions.NAME`` a call of tool NAME whose text is its JSON arguments (one without a
recipient is a preamble the user sees). ``--reasoning-parser openai_gptoss`` and
``--tool-call-parser openai`` both read the raw output (special tokens kept) through this module.

openai-harmony parses token ids of its own ``o200k_harmony`` encoding, so the output text is
encoded again with it (the same ids for gpt-oss, whose tokenizer that is). The encoding needs the
vocabulary file ``o200k_base.tiktoken``: openai-harmony reads it from the folder that
``TIKTOKEN_ENCODINGS_BASE`` names (vLLM's setting for gpt-oss offline), else downloads it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from infernetes.runtime.server.text_stream import partial_marker_len

# The special tokens of the format; a piece of text ending in part of one is held back.
MARKERS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
    "<|endoftext|>",
    "<|startoftext|>",
)
FIRST_SPECIAL_ID = 199998  # o200k_harmony's special tokens are the ids from here up
FUNCTIONS = "functions."  # the recipient prefix of a tool call


@functools.cache
def harmony_encoding() -> Any:
    """openai-harmony's gpt-oss encoding, loaded once; ValueError saying what is missing."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError as error:
        raise ValueError(
            "gpt-oss's harmony format needs the openai-harmony package (pip install openai-harmony)"
        ) from error
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as error:  # openai-harmony raises its own error types from Rust
        where = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
        hint = (
            f"TIKTOKEN_ENCODINGS_BASE={where} must hold o200k_base.tiktoken"
            if where
            else "set TIKTOKEN_ENCODINGS_BASE to a folder holding o200k_base.tiktoken "
            "(it could not be downloaded)"
        )
        raise ValueError(f"gpt-oss's harmony encoding cannot be loaded: {hint}: {error}") from error


@dataclass
class HarmonyPiece:
    """Text added to message ``message`` of the output (empty when the message just opened).
    ``channel`` None: text that is not harmony (a model writing plainly), shown as content."""

    message: int
    channel: str | None
    recipient: str | None
    text: str

    @property
    def function(self) -> str | None:
        """The tool this message calls, if it is a call."""
        if self.recipient and self.recipient.startswith(FUNCTIONS):
            return self.recipient[len(FUNCTIONS) :]
        return None

    @property
    def visible(self) -> bool:
        """Whether the user sees it as content: the answer, a preamble, or plain text."""
        return self.channel is None or (
            self.recipient is None and self.channel in ("final", "commentary")
        )


class HarmonyReader:
    """Reads an assistant turn's output text as it grows: ``feed`` returns what each piece adds
    to which message; ``completed`` counts the messages closed so far."""

    def __init__(self) -> None:
        from openai_harmony import Role, StreamableParser

        self.encoding = harmony_encoding()
        self.parser = StreamableParser(self.encoding, role=Role.ASSISTANT)
        self.pending = ""  # a tail that may be the start of a special token
        self.header_ids: list[int] = []  # ids read since the last message's text
        self.plain = False  # the output is not harmony: the rest is plain text
        self.completed = 0

    def feed(self, text: str) -> list[HarmonyPiece]:
        text = self.pending + text
        keep = partial_marker_len(text, MARKERS)
        text, self.pending = text[: len(text) - keep], text[len(text) - keep :]
        return self._read(text)

    def finish(self, cut: bool = False) -> list[HarmonyPiece]:
        """What is left once generation ends; ``cut`` (by max_tokens) leaves the last message
        open (a call cut off is no call)."""
        pieces = self._read(self.pending)
        self.pending = ""
        if self.plain:
            return pieces
        if cut:  # plain text cut short is still text; a header cut short shows nothing
            return pieces + self._fall_back([])
        from openai_harmony import HarmonyError

        try:
            self.parser.process_eos()
        except HarmonyError:
            return pieces + self._fall_back([])
        self.completed = len(self.parser.messages)
        return pieces

    def _read(self, text: str) -> list[HarmonyPiece]:
        if not text:
            return []
        if self.plain:
            return [HarmonyPiece(self.completed, None, None, text)]
        from openai_harmony import HarmonyError, StreamState

        pieces: list[HarmonyPiece] = []
        ids = self.encoding.encode(text, allowed_special="all")
        for at, token in enumerate(ids):
            was_content = self.parser.state == StreamState.CONTENT
            try:
                self.parser.process(token)
            except HarmonyError:
                return pieces + self._fall_back(ids[at:])
            self.completed = len(self.parser.messages)
            in_content = self.parser.state == StreamState.CONTENT
            if not in_content:
                self.header_ids.append(token)
                continue
            self.header_ids = []
            delta = self.parser.last_content_delta or ""
            if delta or not was_content:
                pieces.append(
                    HarmonyPiece(
                        self.completed,
                        self.parser.current_channel,
                        self.parser.current_recipient,
                        delta,
                    )
                )
        return pieces

    def _fall_back(self, rest: list[int]) -> list[HarmonyPiece]:
        """The output is not (or no longer) harmony: from here on it is plain text. The header
        read so far is shown only if it holds none of the format's tokens (raw markup never
        becomes content)."""
        self.plain = True
        held = [*self.header_ids, *rest]
        self.header_ids = []
        if not held or any(token >= FIRST_SPECIAL_ID for token in held):
            return []
        return [HarmonyPiece(self.completed, None, None, self.encoding.decode(held))]


def read_harmony(text: str, cut: bool = False) -> tuple[list[HarmonyPiece], int]:
    """A whole output's pieces and how many of its messages were closed."""
    reader = HarmonyReader()
    pieces = reader.feed(text) + reader.finish(cut)
    return pieces, reader.completed
