"""A prefill/decode proxy of the shape of vLLM's ``disagg_proxy`` example: each completion or chat
request goes to the prefill server first (one token, ``kv_transfer_params: {"do_remote_decode":
true}``), then to the decode server with the ``kv_transfer_params`` the prefill server answered,
whose answer (streamed or whole) goes back to the client.

    python examples/disagg_proxy.py --prefill http://127.0.0.1:8100 \\
        --decode http://127.0.0.1:8200 --port 8000

Both servers run ``--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": ...}'``
(docs/disaggregation.md). It is an example: one prefill and one decode server, no routing.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

# What the prefill request says: decode elsewhere (vLLM's example leaves the rest unset).
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def make_app(prefill_url: str, decode_url: str) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(timeout=None)

    async def relay(path: str, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        prefill_body = {
            **body,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": REMOTE_DECODE,
        }
        prefill_body.pop("stream_options", None)
        if "max_completion_tokens" in prefill_body:
            prefill_body["max_completion_tokens"] = 1
        prefilled = await client.post(f"{prefill_url}{path}", json=prefill_body, headers=headers)
        if prefilled.status_code != 200:
            return Response(prefilled.content, prefilled.status_code, media_type="application/json")
        decode_body = {**body, "kv_transfer_params": prefilled.json().get("kv_transfer_params")}
        if not body.get("stream"):
            decoded = await client.post(f"{decode_url}{path}", json=decode_body, headers=headers)
            return JSONResponse(decoded.json(), decoded.status_code)
        upstream = client.build_request("POST", f"{decode_url}{path}", json=decode_body)
        upstream.headers.update(headers)
        response = await client.send(upstream, stream=True)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

        return StreamingResponse(
            chunks(), response.status_code, media_type=response.headers.get("content-type")
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await relay("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await relay("/v1/chat/completions", request)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefill", required=True, help="the prefill server's base URL")
    parser.add_argument("--decode", required=True, help="the decode server's base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(make_app(args.prefill, args.decode), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
