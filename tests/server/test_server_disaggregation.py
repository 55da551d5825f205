"""A prefill server and a decode server (the NixlConnector) behind the example P/D proxy
(``examples/disagg_proxy.py``): completions and chat, whole, streamed and concurrent, give the
tokens of one server doing both, and the decode server computed one prompt token of each
(vllm:prompt_tokens_by_source_total). (The protocol's corners are tested on the engine:
tests/engine/test_engine_disaggregation.py.)"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from infernetes.runtime.server.sse_reader import sse_lines
from ports import free_port
from test_server_kv_offload import prompt_tokens_by_source, samples

pytest.importorskip("nixl", reason="the NixlConnector needs the nixl package (extra 'pd')")

PROXY = Path(__file__).resolve().parents[2] / "examples" / "disagg_proxy.py"
DEADLINE_S = 120  # a ceiling for a loaded machine, never what is asserted
_rng = random.Random(2)
PROMPTS = [[_rng.randrange(5, 500) for _ in range(n)] for n in (100, 40, 70)]
MAX_TOKENS = 8


def _server(factory, model_dir, role: str, name: str):
    port = free_port()
    config = {"kv_connector": "NixlConnector", "kv_role": role}
    server = factory(
        [
            str(model_dir),
            "--dtype",
            "float32",  # the decode side computes one token of a prompt computed elsewhere
            "--max-model-len",
            "256",
            "--num-gpu-blocks-override",
            "64",
            "--kv-transfer-config",
            json.dumps(config),
        ],
        env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)},
        log_name=f"{name}.log",
    )
    return server


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/v1/completions", json={}, timeout=2)
            return
        time.sleep(0.3)
    raise RuntimeError("the proxy did not start")


@pytest.fixture(scope="module")
def pd_pair(tiny_llama_dir, server_process_factory):
    prefill = _server(server_process_factory, tiny_llama_dir, "kv_producer", "prefill")
    decode = _server(server_process_factory, tiny_llama_dir, "kv_consumer", "decode")
    proxy_port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(PROXY),
            "--prefill",
            prefill.url,
            "--decode",
            decode.url,
            "--port",
            str(proxy_port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        prefill.wait_ready()
        decode.wait_ready()
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        _wait_ready(proxy_url)
        yield prefill, decode, proxy_url
    finally:
        proxy.kill()
        proxy.wait()
        decode.stop()
        prefill.stop()


def _complete(url: str, prompt: list[int], stream: bool = False) -> list[int]:
    body = {
        "model": None,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_tokens_as_token_ids": True,
        "logprobs": 0,
        "stream": stream,
    }
    if not stream:
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=DEADLINE_S)
        assert answer.status_code == 200, answer.text
        return _token_ids(answer.json()["choices"][0]["logprobs"]["tokens"])
    tokens: list[str] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=DEADLINE_S) as answer:
        assert answer.status_code == 200
        for line in sse_lines(answer.iter_text()):
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                tokens += (choice.get("logprobs") or {}).get("tokens") or []
    return _token_ids(tokens)


def _token_ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_the_pair_behind_the_proxy_gives_the_tokens_of_one_server(pd_pair):
    prefill, decode, proxy_url = pd_pair
    before = prompt_tokens_by_source(decode.url)
    reads_before = nixl_reads(decode.url)
    whole = [_complete(proxy_url, p) for p in PROMPTS]
    streamed = [_complete(proxy_url, p, stream=True) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(lambda p: _complete(proxy_url, p), PROMPTS))
    after = prompt_tokens_by_source(decode.url)
    # the prefill server alone, without the protocol, is the reference
    wanted = [_complete(prefill.url, p) for p in PROMPTS]
    assert whole == streamed == concurrent == wanted
    assert all(len(t) == MAX_TOKENS for t in wanted)
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # three rounds; in the second and third, a prompt's blocks may be the decode side's own hits
    assert grown["local_compute"] == 3 * len(PROMPTS)
    assert grown["external_kv_transfer"] >= sum(len(p) - 1 for p in PROMPTS)
    assert grown["external_kv_transfer"] + grown.get("local_cache_hit", 0) == 3 * sum(
        len(p) - 1 for p in PROMPTS
    )
    # vLLM's NIXL metrics: one read per request that had blocks to read (the first round's at
    # least), their bytes, and no failures.
    reads, moved, failed = nixl_reads(decode.url)
    assert reads - reads_before[0] >= len(PROMPTS)
    assert moved > reads_before[1]
    assert failed == reads_before[2] == 0


def nixl_reads(url: str) -> tuple[float, float, float]:
    """(vllm:nixl_xfer_time_seconds' count, vllm:nixl_bytes_transferred's sum, failed reads)."""
    count = samples(url, "vllm:nixl_xfer_time_seconds_count", "engine")
    moved = samples(url, "vllm:nixl_bytes_transferred_sum", "engine")
    failed = samples(url, "vllm:nixl_num_failed_transfers_total", "engine")
    return sum(count.values()), sum(moved.values()), sum(failed.values())


def test_chat_through_the_proxy_answers_with_the_decode_servers_text(pd_pair):
    prefill, _, proxy_url = pd_pair
    body = {
        "messages": [{"role": "user", "content": "tell me about the sea"}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    through = httpx.post(f"{proxy_url}/v1/chat/completions", json=body, timeout=DEADLINE_S)
    direct = httpx.post(f"{prefill.url}/v1/chat/completions", json=body, timeout=DEADLINE_S)
    assert through.status_code == direct.status_code == 200, through.text
    message = through.json()["choices"][0]["message"]["content"]
    assert message == direct.json()["choices"][0]["message"]["content"]


def test_the_prefill_server_answers_with_the_parameters_to_pull_its_blocks(pd_pair):
    prefill, _, _ = pd_pair
    body = {
        "prompt": PROMPTS[0],
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    answer = httpx.post(f"{prefill.url}/v1/completions", json=body, timeout=DEADLINE_S).json()
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    assert {"remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "tp_size"} <= set(
        params
    )
    plain = httpx.post(f"{prefill.url}/v1/completions", json={**body, "kv_transfer_params": None})
    assert plain.json().get("kv_transfer_params") is None
    bad = httpx.post(f"{prefill.url}/v1/completions", json={**body, "n": 2})
    assert bad.status_code == 400 and "kv_transfer_params" in bad.text
