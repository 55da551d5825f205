"""Helpers for parsing text that arrives in pieces: holding back a possible marker prefix."""

from __future__ import annotations


def partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``markers``.

    That tail must be held back from a stream: the next piece may complete the marker.
    """
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def find_first(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest occurrence of any marker: ``(index, marker)``, or None."""
    hits = [(text.find(m), m) for m in markers if m in text]
    return min(hits) if hits else None
