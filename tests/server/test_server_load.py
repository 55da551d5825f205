"""Load on the real server: many concurrent streams finish with exact token counts, and streams
cut by their clients free every KV block (no running request, KV usage back at 0)."""

from __future__ import annotations

import asyncio
import json

import httpx
from infernetes.runtime.server.sse_reader import asse_lines
from prometheus_client.parser import text_string_to_metric_families

CONCURRENT_STREAMS = 256
CANCELLED_STREAMS = 200
TOKENS = 4


def gauges(url: str) -> dict[str, float]:
    """Samples by name; a finished_reason label is kept as a suffix."""
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            extra = sample.labels.keys() - {"model_name", "engine"}  # one engine core
            if not extra:
                out[sample.name] = sample.value
            elif extra == {"finished_reason"}:
                out[f"{sample.name}:{sample.labels['finished_reason']}"] = sample.value
    return out


async def _stream_tokens(client: httpx.AsyncClient, index: int) -> tuple[int, int, str]:
    body = {
        "model": "tiny",
        "prompt": f"Load {index}",
        "max_tokens": TOKENS,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    chunks = usage = 0
    finish = ""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in asse_lines(response.aiter_text()):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event["choices"]:
                chunks += 1
                finish = event["choices"][0]["finish_reason"] or finish
            else:
                usage = event["usage"]["completion_tokens"]
    return chunks, usage, finish


async def _cut_stream(client: httpx.AsyncClient, index: int) -> None:
    body = {
        "model": "tiny",
        "prompt": f"Cancel {index}",
        "max_tokens": 200,
        "stream": True,
        "ignore_eos": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in asse_lines(response.aiter_text()):
            if line.startswith("data: "):
                return  # leaving the block closes the connection mid-stream


def _client(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {server.api_key}"},
        limits=httpx.Limits(max_connections=CONCURRENT_STREAMS + 8),
        timeout=300,
    )


async def test_concurrent_streams_complete_with_exact_counts(main_server):
    async with _client(main_server) as client:
        results = await asyncio.gather(
            *[_stream_tokens(client, i) for i in range(CONCURRENT_STREAMS)]
        )
    assert all(usage == TOKENS for _, usage, _ in results), results
    assert all(finish == "length" for _, _, finish in results)
    assert all(1 <= chunks <= TOKENS for chunks, _, _ in results)


async def test_cut_streams_free_their_blocks(main_server):
    before = gauges(main_server.url)
    async with _client(main_server) as client:
        await asyncio.gather(*[_cut_stream(client, i) for i in range(CANCELLED_STREAMS)])
        # The engine publishes its gauges after a step: one short request makes one, and its
        # own blocks are freed before the snapshot, so any leak from the cut streams would show.
        for _ in range(100):
            await asyncio.sleep(0.1)
            if httpx.get(f"{main_server.url}/load").json()["server_load"] == 0:
                break
        done = await client.post(
            "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1}
        )
        assert done.status_code == 200
    after = gauges(main_server.url)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    aborted = after["vllm:request_success_total:abort"] - before["vllm:request_success_total:abort"]
    assert aborted == CANCELLED_STREAMS


async def test_outgrowing_the_cache_preempts_and_still_completes(main_server):
    """8 requests growing to 8 blocks each cannot share the 48-block cache: some are preempted
    (recomputed later), and every one still returns all its tokens."""
    before = gauges(main_server.url)
    body = {"model": "tiny", "prompt": "Grow", "max_tokens": 120, "ignore_eos": True}
    async with _client(main_server) as client:
        responses = await asyncio.gather(
            *[client.post("/v1/completions", json=body) for _ in range(8)]
        )
    assert all(r.json()["usage"]["completion_tokens"] == 120 for r in responses)
    after = gauges(main_server.url)
    assert after["vllm:num_preemptions_total"] > before["vllm:num_preemptions_total"]
