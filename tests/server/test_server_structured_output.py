"""The API side of structured output: the backends the server takes (the constraints themselves
are compiled and checked by the engine core: tests/engine/test_engine_structured_output.py)."""

from __future__ import annotations

import pytest
from infernetes.runtime.server.structured_output import GuideError, check_backend


def test_backends():
    check_backend("auto")
    check_backend("guidance:disable-any-whitespace")
    with pytest.raises(GuideError, match=r"xgrammar.*not supported yet"):
        check_backend("xgrammar")
