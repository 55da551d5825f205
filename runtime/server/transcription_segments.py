"""Whisper's timestamp tokens -> timed segments (``verbose_json``, ``srt``, ``vtt``).

With timestamps the decoder prompt ends in ``<|0.00|>`` instead of ``<|notimestamps|>`` (as
vLLM builds it) and the model writes ``<|t|>`` tokens, 0.02 s apart over its 30 s window, around
each stretch of text: ``<|0.00|> text <|1.20|><|1.20|> more <|2.40|>``. A timestamp right after
another opens a segment, so a segment is a slice from one such opening to the timestamp that
ends it (transformers' ``_compute_offsets`` and vLLM cut the same slices). Text after the last
timestamp (the model stopped mid-sentence, or emitted no timestamps at all) becomes a last
segment ending at the clip's end: openai/whisper would decode that stretch again in its next
window, a server decodes each clip once, and dropping the text would lose words."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

TIME_STEP = 0.02  # seconds between timestamp tokens
TIMESTAMP_COUNT = 1501  # <|0.00|> ... <|30.00|>


@dataclass(frozen=True)
class Segment:
    """A stretch of one clip: its times in seconds from the clip's start, its text tokens, and
    the logprobs of every token sampled inside it (its timestamps included)."""

    start: float
    end: float
    tokens: list[int]
    logprobs: list[float]

    @property
    def avg_logprob(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else 0.0


def clip_segments(
    tokens: Sequence[int],
    logprobs: Sequence[float],
    first_timestamp: int,
    clip_seconds: float,
) -> list[Segment]:
    """The segments of one clip's sampled ``tokens`` (those after the prompt's ``<|0.00|>``, the
    end token already dropped) with their ``logprobs``; ``first_timestamp`` is ``<|0.00|>``'s id.
    Times are as the model wrote them, not reordered (vLLM applies no timestamp rules)."""

    def is_timestamp(token: int) -> bool:
        return first_timestamp <= token < first_timestamp + TIMESTAMP_COUNT

    def seconds(token: int) -> float:
        return round((token - first_timestamp) * TIME_STEP, 2)

    sequence = [first_timestamp, *tokens]
    scores = [None, *logprobs]  # the prompt's <|0.00|> was not sampled

    def segment(begin: int, end: int, start: float, stop: float) -> Segment:
        text = [token for token in sequence[begin:end] if not is_timestamp(token)]
        sampled = [score for score in scores[begin:end] if score is not None]
        return Segment(start, stop, text, sampled)

    stamps = [i for i, token in enumerate(sequence) if is_timestamp(token)]
    # a timestamp right after another opens a segment; the last timestamp closes one
    cuts = [i for i in stamps[1:] if is_timestamp(sequence[i - 1])]
    last_stamp = stamps[-1]
    if last_stamp + 1 not in cuts:
        cuts.append(last_stamp + 1)
    segments = []
    opening = 0
    for cut in cuts:
        if cut - opening > 1:  # a lone timestamp holds nothing
            start, stop = seconds(sequence[opening]), seconds(sequence[cut - 1])
            segments.append(segment(opening, cut, start, stop))
        opening = cut
    if len(sequence) > last_stamp + 1:  # text no timestamp closed
        start = seconds(sequence[last_stamp])
        segments.append(segment(last_stamp + 1, len(sequence), start, round(clip_seconds, 2)))
    return segments


def compression_ratio(text: str) -> float:
    """How much zlib shrinks the text's UTF-8 (vLLM's and openai/whisper's hallucination cue:
    repeated text compresses well); 0 for no text."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0
