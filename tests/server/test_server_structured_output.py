"""The API side of structured output: the backends the server takes (the constraints themselves
are compiled and checked by the engine core: tests/engine/test_engine_structured_output.py)."""

from __future__ import annotations

import pytest
from infernetes.runtime.server.structured_output import GuideError, check_backend


def test_backends():
    check_backend("auto")
    check_backend("guidance:disable-any-whitespace")
    check_backend("xgrammar")
    with pytest.raises(GuideError, match=r"outlines.*not supported yet"):
        check_backend("outlines")


def test_a_request_may_name_only_the_servers_backend():
    check_backend("auto", server_backend="guidance")
    check_backend("xgrammar", server_backend="xgrammar")
    with pytest.raises(GuideError, match=r"chosen per server, which runs 'guidance'"):
        check_backend("xgrammar", server_backend="guidance")
