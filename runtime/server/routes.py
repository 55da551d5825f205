"""The HTTP routes: OpenAI endpoints, tokenizer routes, probes, metrics, and the dev-mode routes
(VLLM_SERVER_DEV_MODE=1)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from infernetes.runtime.server.errors import APIError, error_response
from infernetes.runtime.server.off_loop import off_loop
from infernetes.runtime.server.protocol import (
    ChatCompletionRequest,
    ClassificationRequest,
    CollectiveRpcRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ErrorResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    PoolingRequest,
    RequestBody,
    RerankRequest,
    ResponsesRequest,
    ScoreRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TranscriptionRequest,
    UnloadLoRAAdapterRequest,
)
from infernetes.runtime.server.state import ServerState
from infernetes.runtime.server.streaming import ClientDisconnected, keep_alive, until_disconnected
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from infernetes import __version__

# What the OpenAPI document says every route can answer besides 200: OpenAI error JSON.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "Bad request: malformed JSON, or a field is invalid (the error's param names it)"),
        (401, "A valid API key is required (--api-key)"),
        (404, "Unknown model or route"),
        (408, "The request body did not arrive in time"),
        (413, "The request body is too large"),
        (429, "Too many concurrent requests (--max-concurrency)"),
        (500, "A fault of the server's own"),
        (503, "Loading, draining, or the engine has stopped"),
    )
}
router = APIRouter(responses=ERROR_RESPONSES)
dev_router = APIRouter(responses=ERROR_RESPONSES)

# A client that went away gets nothing; 499 is what nginx logs for it.
CLIENT_CLOSED = 499


def server(request: Request) -> ServerState:
    return request.app.state.server


def _json(model: Any) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json"))


async def _answer(request: Request, work: Any) -> Response:
    try:
        result = await until_disconnected(request, work)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    if isinstance(result, AsyncIterator):  # async generators are too
        return _event_stream(request, result)
    return _json(result)


def _event_stream(request: Request, events: AsyncIterator[bytes]) -> StreamingResponse:
    interval = server(request).settings.sse_keep_alive_interval
    return StreamingResponse(
        keep_alive(events, interval),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


# ---------------------------------------------------------------- probes and info


@router.get("/health")
async def health(request: Request) -> Response:
    state = server(request)
    if state.healthy:
        return Response(status_code=200)
    reason = (
        "loading" if state.engine is None and state.load_error is None else "engine not running"
    )
    return error_response(f"unhealthy: {reason}", 503)


@router.get("/ping")
async def ping(request: Request) -> Response:
    return await health(request)


@router.post("/ping")
async def ping_post(request: Request) -> Response:
    return await health(request)


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": __version__})


@router.get("/load")
async def load(request: Request) -> JSONResponse:
    return JSONResponse({"server_load": getattr(request.app.state, "server_load", 0)})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = server(request)
    body = state.metrics.exposition() if state.metrics is not None else b""
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> JSONResponse:
    state = server(request)
    # Only once the engine can answer, as vLLM: clients that wait on /v1/models
    # (`vllm bench`, GuideLLM) would otherwise send their first requests into 503s.
    state.require_engine()
    max_len = getattr(state.engine, "max_model_len", None)
    cards = [
        ModelCard(id=name, root=state.settings.model, max_model_len=max_len)
        for name in state.settings.served_model_names
    ]
    cards += [
        ModelCard(id=name, root=lora.lora_path, parent=lora.base_model_name, max_model_len=max_len)
        for name, lora in state.loras.adapters.items()
    ]
    return _json(ModelList(data=cards))


# ---------------------------------------------------------------- LoRA adapters at run time


def _runtime_lora_updating(state: ServerState) -> None:
    if not state.settings.allow_runtime_lora_updating:
        raise APIError(
            "loading and unloading LoRA adapters at run time is off; set "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True to allow it",
            404,
        )


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> Response:
    state = server(request)
    _runtime_lora_updating(state)
    servings = state.require_generation()
    await state.loras.load(servings.engine, body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> Response:
    state = server(request)
    _runtime_lora_updating(state)
    servings = state.require_generation()
    await state.loras.unload(servings.engine, body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


# ---------------------------------------------------------------- OpenAI endpoints


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    servings = server(request).require_generation()
    return await _answer(request, servings.completion.create(body))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    servings = server(request).require_generation()
    return await _answer(request, servings.chat.create(body))


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request) -> Response:
    servings = server(request).require_generation()
    work = servings.responses.create(body)
    try:
        result = await until_disconnected(request, work)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    if isinstance(result, AsyncIterator):
        return _event_stream(request, result)
    return JSONResponse(result)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> JSONResponse:
    return JSONResponse(server(request).require_generation().responses.get(response_id))


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    servings = server(request).require_embedding()
    return await _answer(request, servings.embedding.create(body))


@router.post("/pooling")
async def pooling(body: PoolingRequest, request: Request) -> Response:
    servings = server(request).require_embedding()
    return await _answer(request, servings.embedding.pool(body))


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request) -> Response:
    servings = server(request).require_cross_encoder()
    return await _answer(request, servings.score.score(body))


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request) -> Response:
    servings = server(request).require_cross_encoder()
    return await _answer(request, servings.score.rerank(body))


@router.post("/classify")
async def classify(body: ClassificationRequest, request: Request) -> Response:
    servings = server(request).require_cross_encoder()
    return await _answer(request, servings.score.classify(body))


@router.post("/v1/audio/transcriptions")
async def audio_transcriptions(request: Request) -> Response:
    return await _audio(request, "transcribe")


@router.post("/v1/audio/translations")
async def audio_translations(request: Request) -> Response:
    return await _audio(request, "translate")


async def _audio(request: Request, task: str) -> Response:
    """A multipart form: the audio ``file`` and ``TranscriptionRequest``'s fields."""
    servings = server(request).require_transcription()
    # a malformed form, or more files or fields than these, is Starlette's 400
    form = await request.form(max_files=1, max_fields=64)
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise APIError("file: the audio file is required, as a multipart file field", 400, "file")
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if name == "file":
            continue
        if name == "timestamp_granularities[]":
            fields.setdefault(name, []).append(value)
        else:
            fields[name] = value
    try:
        body = TranscriptionRequest.model_validate(fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
    servings.transcription.check_file_size(upload.size)  # before it is read
    audio = await upload.read()
    await form.close()
    work = servings.transcription.create(body, audio, task)
    try:
        result = await until_disconnected(request, work)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    if isinstance(result, str):
        return PlainTextResponse(result)
    if isinstance(result, AsyncIterator):
        return _event_stream(request, result)
    return _json(result)


# /invocations (SageMaker's one route): the payload's shape picks the endpoint, as vLLM does.
_INVOKED_BY_KEY: tuple[tuple[str, type[RequestBody]], ...] = (
    ("messages", ChatCompletionRequest),
    ("prompt", CompletionRequest),
    ("text_1", ScoreRequest),
    ("query", RerankRequest),
    ("input", EmbeddingRequest),
)


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    try:
        payload = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"the request body is not valid JSON: {exc}", 400) from exc
    model = next(
        (model for key, model in _INVOKED_BY_KEY if isinstance(payload, dict) and key in payload),
        None,
    )
    if model is None:
        raise APIError(
            "/invocations routes by the payload: messages (chat completions), prompt "
            "(completions), text_1 (score), query (rerank) or input (embeddings, or classify on "
            "a cross-encoder); none of them is in this body",
            400,
        )
    try:
        body = model.model_validate(payload)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
    match body:
        case ChatCompletionRequest():
            return await chat_completions(body, request)
        case CompletionRequest():
            return await completions(body, request)
        case ScoreRequest():
            return await score(body, request)
        case RerankRequest():
            return await rerank(body, request)
        case EmbeddingRequest() if server(request).is_cross_encoder:
            as_classification = ClassificationRequest.model_validate(payload)
            return await classify(as_classification, request)
        case EmbeddingRequest():
            return await embeddings(body, request)
    raise AssertionError(f"unrouted body {type(body).__name__}")


@router.post("/tokenize")
async def tokenize(
    body: TokenizeCompletionRequest | TokenizeChatRequest, request: Request
) -> JSONResponse:
    servings = server(request).require_engine()
    return _json(await off_loop(servings.tokenization.tokenize_request, body))


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> JSONResponse:
    state = server(request)
    if not state.settings.enable_tokenizer_info_endpoint:
        raise APIError(
            "/tokenizer_info is off; start the server with --enable-tokenizer-info-endpoint", 404
        )
    servings = state.require_engine()
    return JSONResponse(servings.tokenization.tokenizer_info())


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    servings = server(request).require_engine()
    return _json(await off_loop(servings.tokenization.detokenize_request, body))


# ---------------------------------------------------------------- dev mode


@dev_router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request) -> Response:
    await server(request).require_engine().engine.reset_prefix_cache()
    return Response(status_code=200)


@dev_router.post("/sleep")
async def sleep(request: Request, level: int = Query(1, ge=1, le=2)) -> Response:
    engine = server(request).require_engine().engine
    await _engine_call(engine.sleep(level))
    return Response(status_code=200)


@dev_router.post("/wake_up")
async def wake_up(request: Request, tags: Annotated[list[str] | None, Query()] = None) -> Response:
    """vLLM's ``/wake_up?tags=weights&tags=kv_cache`` (all when none is named)."""
    state = server(request)
    if state.engine is None:
        raise APIError("the model is still loading; retry shortly", 503)
    await _engine_call(state.engine.wake_up(tags))
    return Response(status_code=200)


@dev_router.post("/collective_rpc")
async def collective_rpc(body: CollectiveRpcRequest, request: Request) -> JSONResponse:
    engine = server(request).require_engine().engine
    results = await _engine_call(engine.collective_rpc(body.method, body.args, body.kwargs))
    return JSONResponse({"results": json.loads(json.dumps(results, default=repr))})


async def _engine_call(call: Any) -> Any:
    """An engine maintenance call; what it refuses (a ValueError) is the client's 400."""
    try:
        return await call
    except ValueError as error:
        raise APIError(str(error), 400) from error


@dev_router.get("/server_info")
async def server_info(request: Request) -> JSONResponse:
    """The configuration the server runs with, grouped as ``infernetes config`` prints it
    (secrets masked), and the version: vLLM's dev-mode ``/server_info``."""
    return JSONResponse({"version": __version__, "vllm_config": server(request).serve_config})


@dev_router.get("/is_sleeping")
async def is_sleeping(request: Request) -> JSONResponse:
    state = server(request)
    return JSONResponse({"is_sleeping": bool(getattr(state.engine, "is_sleeping", False))})


def include_routes(app: FastAPI, dev_mode: bool) -> None:
    app.include_router(router)
    if dev_mode:
        app.include_router(dev_router)
