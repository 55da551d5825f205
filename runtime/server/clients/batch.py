"""``infernetes run-batch``: the OpenAI batch file format through the engine, in-process.

Each input line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions" | "/v1/embeddings", "body": {...}}``; each output line is ``{"id",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}``. Lines run
concurrently (the engine batches them); a bad line gets its error, the others still run. Input
and output may be local paths or http(s) URLs (the output is uploaded with PUT).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from typing import Any

import httpx
from infernetes.runtime.server.errors import APIError, error_body
from infernetes.runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from infernetes.runtime.server.settings import FrontendSettings
from infernetes.runtime.server.state import ServerState
from pydantic import ValidationError

from infernetes.schema.config import ServeConfig

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


def _is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def read_input(location: str) -> list[str]:
    if _is_url(location):
        response = httpx.get(location, timeout=60, follow_redirects=True)
        response.raise_for_status()
        text = response.text
    else:
        with open(location, encoding="utf-8") as handle:
            text = handle.read()
    return [line for line in text.splitlines() if line.strip()]


def write_output(location: str, lines: list[str], tmp_dir: str | None) -> None:
    """Writes to ``tmp_dir`` first when given (then moves or uploads), else directly."""
    payload = "".join(line + "\n" for line in lines)
    if tmp_dir is None:
        if _is_url(location):
            httpx.put(location, content=payload.encode(), timeout=60).raise_for_status()
        else:
            with open(location, "w", encoding="utf-8") as handle:
                handle.write(payload)
        return
    with tempfile.NamedTemporaryFile(
        "w", dir=tmp_dir, suffix=".jsonl", delete=False, encoding="utf-8"
    ) as handle:
        handle.write(payload)
        staged = handle.name
    try:
        if _is_url(location):
            with open(staged, "rb") as body:
                httpx.put(location, content=body.read(), timeout=60).raise_for_status()
        else:
            shutil.move(staged, location)
    finally:
        if os.path.exists(staged):
            os.unlink(staged)


def _record(custom_id: Any, status: int | None, body: Any, error: Any = None) -> str:
    response = (
        None
        if status is None
        else {"status_code": status, "request_id": f"vllm-batch-{uuid.uuid4().hex}", "body": body}
    )
    return json.dumps(
        {
            "id": f"vllm-{uuid.uuid4().hex}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        },
        ensure_ascii=False,
    )


async def run_line(state: ServerState, line: str) -> str:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        return _record(
            None, None, None, {"code": "invalid_json", "message": f"line is not JSON: {exc}"}
        )
    if not isinstance(item, dict):
        return _record(
            None, None, None, {"code": "invalid_line", "message": "a line must be a JSON object"}
        )
    custom_id = item.get("custom_id")
    url, method = item.get("url"), str(item.get("method", "POST")).upper()
    if method != "POST" or url not in ROUTES:
        message = (
            f"unsupported request {method} {url!r}; supported: POST {', '.join(sorted(ROUTES))}"
        )
        return _record(custom_id, 400, error_body(message, 400, "url"))
    body = item.get("body") or {}
    try:
        result: Any  # a response model: create() streams only when the request says so
        if url == "/v1/embeddings":
            embedding = EmbeddingRequest.model_validate(body)
            result = await state.require_embedding().embedding.create(embedding)
        elif url == "/v1/chat/completions":
            chat = ChatCompletionRequest.model_validate({**body, "stream": False})
            result = await state.require_generation().chat.create(chat)
        else:
            completion = CompletionRequest.model_validate({**body, "stream": False})
            result = await state.require_generation().completion.create(completion)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return _record(custom_id, 400, error_body(problems, 400))
    except APIError as exc:
        return _record(custom_id, exc.status, error_body(exc.message, exc.status, exc.param))
    return _record(custom_id, 200, result.model_dump(mode="json"))


async def run_batch(
    config: ServeConfig,
    input_location: str,
    output_location: str,
    output_tmp_dir: str | None,
    metrics_address: tuple[str, int] | None = None,
) -> int:
    """Runs every line; returns how many lines failed."""
    from infernetes.runtime.engine.async_engine import AsyncEngine, core_process_enabled

    lines = read_input(input_location)
    state = ServerState(FrontendSettings.from_config(config))
    engine = await asyncio.to_thread(
        AsyncEngine.from_config, config, [state.stat_fanout], core_process_enabled()
    )
    try:
        state.attach_engine(engine)
        if metrics_address is not None:
            import prometheus_client

            host, port = metrics_address
            assert state.metrics is not None  # attach_engine made it
            prometheus_client.start_http_server(port, addr=host, registry=state.metrics.registry)
        results = await asyncio.gather(*[run_line(state, line) for line in lines])
    finally:
        await engine.shutdown()
    write_output(output_location, list(results), output_tmp_dir)
    return sum(
        1
        for r in results
        if json.loads(r)["response"] is None or json.loads(r)["response"]["status_code"] != 200
    )
