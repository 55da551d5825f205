"""xLAM format (Salesforce xLAM): a JSON list of ``{"name", "arguments"}`` objects, written

- as the whole output: ``[{"name": "get_weather", "arguments": {"city": "Paris"}}]``;
- in a fenced block, three backticks and an optional ``json`` before it, three after;
- after ``[TOOL_CALLS]``, or between ``<tool_call>`` and ``</tool_call>``;

with content before the block. A ``</think>`` before the list is left to ``--reasoning-parser``,
and text after a closed block is not kept as content (vLLM's parser keeps it).
"""

from __future__ import annotations

import re

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.text_stream import partial_marker_len
from infernetes.runtime.server.tool_parsers.base import (
    PartialCall,
    ToolParser,
    parse_call_list,
    partial_call_in_list,
)

FENCE = "```"
# A fence opens calls only when a list or object follows it (a code block stays content).
FENCE_OPEN = re.compile(r"```(?:json)?\s*(?=[\[{])")
# The tail of a stream that may still become such an opening: held back from the content.
FENCE_PENDING = re.compile(r"```(?:j(?:s(?:o(?:n)?)?)?)?\s*$")
TAGS = {"[TOOL_CALLS]": "", "<tool_call>": "</tool_call>"}
# What the start of a list of calls looks like once its whitespace is dropped.
CALLS_START = ('[{"name"', '{"name"')


def _could_be_calls(body: str) -> bool:
    """Whether a body cut off here is calls being written (rather than text)."""
    compact = re.sub(r"\s", "", body)
    return any(compact.startswith(s) or s.startswith(compact) for s in CALLS_START)


class XLamToolParser(ToolParser):
    name = "xlam"
    markers = tuple(TAGS)  # and a fence before a list, found by FENCE_OPEN

    def section_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith("[") and not stripped.startswith("[TOOL_CALLS]"):
            return len(text) - len(stripped)
        found = [i for i in (text.find(tag) for tag in TAGS) if i >= 0]
        fence = FENCE_OPEN.search(text)
        if fence is not None:
            found.append(fence.start())
        return min(found) if found else None

    def hold_back(self, text: str) -> int:
        if not text.strip() or text.lstrip().startswith("["):
            return len(text)  # may still be a list opening the output
        pending = FENCE_PENDING.search(text)
        held = len(text) - pending.start() if pending is not None else 0
        return max(held, partial_marker_len(text, (*self.markers, FENCE)))

    @staticmethod
    def _body(section: str) -> str:
        for tag, close in TAGS.items():
            if section.startswith(tag):
                body = section[len(tag) :]
                return body.partition(close)[0] if close else body
        fence = FENCE_OPEN.match(section)
        if fence is not None:
            return section[fence.end() :].partition(FENCE)[0]
        return section

    def parse_section(self, section: str, final: bool) -> list[FunctionCall] | None:
        return parse_call_list(self._body(section), final)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        return partial_call_in_list(self._body(section), complete)

    def unparsed_is_content(self, section: str, cut: bool) -> bool:
        return not cut or not _could_be_calls(self._body(section))
