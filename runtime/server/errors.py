"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Every failure a client can cause maps to a 4xx here; only a fault of our own is a 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from infernetes.runtime.engine.async_engine import EngineDeadError
from infernetes.runtime.server.protocol import ErrorInfo, ErrorResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error to return to the client as OpenAI error JSON."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> dict:
    info = ErrorInfo(
        message=message,
        type=_ERROR_TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "") + "Error"),
        param=param,
        code=status,
    )
    return ErrorResponse(error=info).model_dump()


class _AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: an error message may quote the client's text, and a lone
    surrogate in it would fail UTF-8 encoding (a 500 for answering a 400)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_response(
    message: str, status: int, param: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return _AsciiJSONResponse(
        error_body(message, status, param), status_code=status, headers=headers
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable line per problem: the field path and what was wrong with it."""
    lines = []
    first_param = None
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # loc is ("body", character offset): not a field
            reason = (err.get("ctx") or {}).get("error", "malformed JSON")
            offset = err["loc"][-1] if len(err.get("loc", ())) > 1 else None
            where = f" at character {offset}" if isinstance(offset, int) else ""
            return f"the request body is not valid JSON: {reason}{where}", None
        loc = [str(part) for part in err.get("loc", ()) if part != "body"]
        path = ".".join(loc) or "body"
        first_param = first_param or path
        lines.append(f"{path}: {err.get('msg', 'invalid value')}")
    return "; ".join(lines) or "invalid request body", first_param


def _openapi_without_422(app: FastAPI) -> Any:
    """FastAPI documents 422 for every body; this server answers 400 instead (see below)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def install_error_handlers(app: FastAPI) -> None:
    app.openapi = _openapi_without_422(app)  # type: ignore[method-assign]

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        # 400, as OpenAI and vLLM answer: clients raise BadRequestError for it
        message, param = _validation_message(exc)
        return error_response(message, 400, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(str(exc.detail), exc.status_code, headers=exc.headers)  # 405: Allow

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(str(exc), 503)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error while serving a request")
        return error_response(f"internal server error: {type(exc).__name__}: {exc}", 500)
