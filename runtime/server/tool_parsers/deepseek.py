"""DeepSeek formats: the calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``, each
between ``<｜tool▁call▁begin｜>`` and ``<｜tool▁call▁end｜>``.

- ``deepseek_v3`` (V3, R1-0528): ``function<｜tool▁sep｜>NAME`` then the arguments in a fenced
  JSON block (a newline, three backticks and ``json``, a newline, the object, a newline and
  three backticks).
- ``deepseek_v31`` (V3.1, V3.2 chat): ``NAME<｜tool▁sep｜>{...}``.

The arguments are the model's own text, passed on as written (as vLLM does).
"""

from __future__ import annotations

from infernetes.runtime.server.protocol import FunctionCall
from infernetes.runtime.server.tool_parsers.base import PartialCall, TaggedToolParser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "\n```json\n", "\n```"


class DeepSeekV3ToolParser(TaggedToolParser):
    name = "deepseek_v3"
    markers = (CALLS_BEGIN,)
    call_open, call_close = CALL_BEGIN, CALL_END
    requires_close = True

    @staticmethod
    def _head(body: str) -> tuple[str, str] | None:
        """``(name, text after the opening fence)`` once both are written."""
        _, sep, rest = body.partition(SEP)
        name, fence, args = rest.partition(FENCE_OPEN)
        if not sep or not fence or "\n" in name or not name.strip():
            return None
        return name.strip(), args

    def parse_block(self, body: str) -> FunctionCall | None:
        head = self._head(body)
        if head is None or not head[1].endswith(FENCE_CLOSE):
            return None
        return FunctionCall(name=head[0], arguments=head[1][: -len(FENCE_CLOSE)])

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        block = self.open_block(section, complete)
        head = None if block is None else self._head(block)
        if head is None:
            return None
        # A JSON value has no raw newline, so the first one followed by ``` closes the fence.
        args = head[1].split(FENCE_CLOSE, 1)[0]
        return PartialCall(head[0], self.open_text(args, FENCE_CLOSE))


class DeepSeekV31ToolParser(TaggedToolParser):
    name = "deepseek_v31"
    markers = (CALLS_BEGIN,)
    call_open, call_close = CALL_BEGIN, CALL_END
    requires_close = True

    def parse_block(self, body: str) -> FunctionCall | None:
        name, sep, args = body.partition(SEP)
        if not sep or not name.strip():
            return None
        return FunctionCall(name=name.strip(), arguments=args)

    def partial_call(self, section: str, complete: int) -> PartialCall | None:
        block = self.open_block(section, complete)
        if block is None or SEP not in block:
            return None
        name, _, args = block.partition(SEP)
        return PartialCall(name.strip(), self.open_text(args)) if name.strip() else None
