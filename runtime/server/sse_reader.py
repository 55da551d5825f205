"""Reading a server-sent event stream line by line as the SSE spec does: only LF and CR LF end
a line. httpx's ``iter_lines``/``aiter_lines`` and ``str.splitlines`` also split at U+2028,
U+2029, U+0085 and the other Unicode line boundaries, which an event's JSON may hold raw: the
server writes JSON unescaped (``streaming.sse``), and a random model's tokens decode to them.

The clients of the tests, the benchmarks and ``cluster/`` read their streams with these."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator


def _split(text: str) -> tuple[list[str], str]:
    """The complete lines of ``text`` and the unfinished rest."""
    *lines, rest = text.split("\n")
    return [line.removesuffix("\r") for line in lines], rest


def sse_lines(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of a stream's text, given in chunks cut anywhere (``response.iter_text()``, or
    a whole body as one chunk); an unfinished last line is dropped, as the spec drops an
    unfinished event."""
    rest = ""
    for chunk in chunks:
        lines, rest = _split(rest + chunk)
        yield from lines


async def asse_lines(chunks: AsyncIterable[str]) -> AsyncIterator[str]:
    """``sse_lines`` of an async stream's text (``response.aiter_text()``)."""
    rest = ""
    async for chunk in chunks:
        lines, rest = _split(rest + chunk)
        for line in lines:
            yield line
