"""runtime/server/sse_reader.py: an event whose JSON holds raw Unicode line separators (a random
model's tokens do) is read whole, where httpx's line iterators cut it."""

from __future__ import annotations

import json

import httpx
from infernetes.runtime.server.sse_reader import asse_lines, sse_lines

# U+2028 (line separator), U+0085 (next line) and U+2029 in a token's text, then [DONE]; the
# first line ends with CR LF, the others with LF.
TEXT = "a\u2028b\x85c\u2029d"
BODY = ('data: {"text": "' + TEXT + '"}\r\n\ndata: [DONE]\n\n').encode()


def _chunks(size: int) -> list[bytes]:
    """The body cut every `size` bytes: through the UTF-8 of a separator and between CR and LF."""
    return [BODY[i : i + size] for i in range(0, len(BODY), size)]


def _data(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def test_httpx_line_iterators_cut_the_event() -> None:
    """Why the helper exists: httpx ends a line at every Unicode line boundary."""
    lines = list(httpx.Response(200, content=iter(_chunks(7))).iter_lines())
    assert lines[:4] == ['data: {"text": "a', "b", "c", 'd"}']


def test_an_event_with_unicode_line_separators_is_read_whole() -> None:
    for size in (1, 2, 7, len(BODY)):
        response = httpx.Response(200, content=iter(_chunks(size)))
        lines = list(sse_lines(response.iter_text()))
        assert lines == ['data: {"text": "' + TEXT + '"}', "", "data: [DONE]", ""], size
        assert json.loads(_data(lines)[0]) == {"text": TEXT}


async def test_an_async_stream_is_read_the_same_way() -> None:
    async def body():
        for chunk in _chunks(3):
            yield chunk

    response = httpx.Response(200, content=body())
    lines = [line async for line in asse_lines(response.aiter_text())]
    assert _data(lines) == ['{"text": "' + TEXT + '"}', "[DONE]"]
    cut = httpx.Response(200, content=body())
    assert await anext(cut.aiter_lines()) == 'data: {"text": "a'


def test_a_whole_body_and_an_unfinished_last_line() -> None:
    """A whole body is one chunk; a last line with no line end is not a line (nor an event)."""
    text = BODY.decode() + "data: {"
    assert _data(list(sse_lines([text]))) == ['{"text": "' + TEXT + '"}', "[DONE]"]
