"""``--api-server-count 2``: two API processes on one socket in front of one engine core. Many
concurrent requests are all answered, both processes answer some (``X-API-Server``), the
``/metrics`` of either reports the engine's counters once (equal to what was sent), a stream
cut by its client is aborted in the core, SIGTERM ends every process (exit 0), and so does the
core's death (exit 1); only the core maps torch."""

from __future__ import annotations

import asyncio
import re
import signal
import time

import httpx
import psutil
import pytest

REQUESTS = 48
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def server(tiny_llama_dir, server_process_factory):
    process = server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "256",
            "--api-server-count",
            "2",
        ],
        log_name="api-server-count.log",
    )
    with process:
        yield process


def _counter(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def _completions(url: str, count: int) -> list[httpx.Response]:
    # A connection per request, so the kernel hands each to either process.
    async with httpx.AsyncClient(
        timeout=120, limits=httpx.Limits(max_keepalive_connections=0)
    ) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{url}/v1/completions",
                    json={"model": "tiny", "prompt": f"Hello number {i}", "max_tokens": MAX_TOKENS},
                )
                for i in range(count)
            )
        )


def _metrics_of_each_process(url: str) -> dict[str, str]:
    """``/metrics`` as each API process answers it (fresh connections until both have)."""
    seen: dict[str, str] = {}
    for _ in range(200):
        response = httpx.get(f"{url}/metrics", headers={"connection": "close"})
        seen.setdefault(response.headers["x-api-server"], response.text)
        if len(seen) == 2:
            break
    return seen


def test_both_processes_serve_and_metrics_count_each_request_once(server):
    responses = asyncio.run(_completions(server.url, REQUESTS))
    assert [r.status_code for r in responses] == [200] * REQUESTS
    served_by = {r.headers["x-api-server"] for r in responses}
    extra = 0
    while served_by != {"0", "1"} and extra < 200:  # the kernel's choice; more until both did
        more = asyncio.run(_completions(server.url, 8))
        served_by |= {r.headers["x-api-server"] for r in more}
        responses += more
        extra += 8
    assert served_by == {"0", "1"}
    usage = [r.json()["usage"] for r in responses]
    metrics = _metrics_of_each_process(server.url)
    assert set(metrics) == {"0", "1"}
    for text in metrics.values():
        assert _counter(text, "vllm:request_success_total") == len(responses)
        assert _counter(text, "vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage)
        generated = sum(u["completion_tokens"] for u in usage)
        assert _counter(text, "vllm:generation_tokens_total") == generated
        assert _counter(text, "vllm:num_requests_running") == 0
        assert _counter(text, "vllm:e2e_request_latency_seconds_count") == len(responses)


def test_a_stream_its_client_leaves_is_aborted_in_the_core(server):
    body = {"model": "tiny", "prompt": "Count", "max_tokens": 200, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
        for _ in zip(range(3), stream.iter_lines(), strict=False):
            pass  # a few events, then the client goes
    for _ in range(100):
        metrics = _metrics_of_each_process(server.url)
        aborted = [
            _counter(t, "vllm:request_success_total", finished_reason="abort")
            for t in metrics.values()
        ]
        if aborted == [1.0, 1.0]:
            break
        time.sleep(0.2)
    assert aborted == [1.0, 1.0]
    assert [_counter(t, "vllm:num_requests_running") for t in metrics.values()] == [0.0, 0.0]


def test_sigterm_ends_every_process(tiny_llama_dir, server_process_factory):
    process = server_process_factory(
        [str(tiny_llama_dir), "--max-model-len", "256", "--api-server-count", "2"],
        log_name="api-server-count-stop.log",
    )
    with process:
        children = psutil.Process(process.process.pid).children(recursive=True)
        assert len(children) >= 3  # the core and two API processes
        assert httpx.get(f"{process.url}/health").status_code == 200
        code = process.stop(signal.SIGTERM)
    assert code == 0, process.tail()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == []


def test_a_dead_engine_core_ends_the_server_with_exit_1(
    tiny_llama_dir, server_process_factory, maps_torch
):
    process = server_process_factory(
        [str(tiny_llama_dir), "--max-model-len", "256", "--api-server-count", "2"],
        log_name="api-server-count-core-death.log",
    )
    with process:
        children = psutil.Process(process.process.pid).children(recursive=True)
        [core] = [child for child in children if maps_torch(child.pid)]  # the API side has none
        core.kill()
        code = process.process.wait(60)
    assert code == 1, process.tail()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == []


def test_what_the_api_processes_cannot_share_is_refused_before_loading(tiny_llama_dir):
    from infernetes.runtime.preflight import check_settings

    from infernetes.schema.config import build_config

    model = str(tiny_llama_dir)
    lora = build_config(model, api_server_count=2, enable_lora=True)
    with pytest.raises(ValueError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be combined"):
        check_settings(lora, environ={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    sleep = build_config(model, api_server_count=2, enable_sleep_mode=True)
    with pytest.raises(ValueError, match="--enable-sleep-mode cannot be combined"):
        check_settings(sleep, environ={})
    check_settings(build_config(model, enable_sleep_mode=True, device="cpu"), environ={})
