"""Timed segments as subtitle files: SubRip (``srt``) and WebVTT (``vtt``), as OpenAI's
transcription API writes them: one cue per segment, its text stripped."""

from __future__ import annotations

from collections.abc import Sequence

from infernetes.runtime.server.protocol import TranscriptionSegment


def _clock(seconds: float, decimal_mark: str) -> str:
    """``HH:MM:SS,mmm`` (SubRip) or ``HH:MM:SS.mmm`` (WebVTT)."""
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{decimal_mark}{millis:03d}"


def _cue_text(segment: TranscriptionSegment) -> str:
    # "-->" inside a cue's text would read as a timing line
    return segment.text.strip().replace("-->", "->")


def srt(segments: Sequence[TranscriptionSegment]) -> str:
    cues = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{_cue_text(s)}\n"
        for i, s in enumerate(segments, 1)
    ]
    return "\n".join(cues)


def vtt(segments: Sequence[TranscriptionSegment]) -> str:
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{_cue_text(s)}\n" for s in segments]
    return "\n".join(["WEBVTT\n", *cues])
