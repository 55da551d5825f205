"""Errors the engine gives the API for a request, importable without torch: an exception that
crosses the engine core's pipe is rebuilt in the API process, which must not import torch for it."""

from __future__ import annotations

from typing import Any


class RequestError(ValueError):
    """A request the engine cannot take, with the request field it is about (``param`` in the
    OpenAI error the API returns)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:  # it crosses the engine core's pipe
        return (type(self), (str(self), self.param))
