"""Parallel serving on the CPU. ``--tensor-parallel-size 2``: the engine core starts a worker
process per rank (gloo); the official openai client gets transformers' greedy tokens; a killed
worker fails /health and stops the server; SIGTERM leaves no process behind.
``--data-parallel-size 2``: two engine-core processes behind one API server, each with its
``engine`` series in /metrics."""

from __future__ import annotations

import signal

import httpx
import openai
import psutil
import pytest
from infernetes.runtime.testing import hf_greedy_tokens
from waits import gone, wait_until

ARGS = [
    "--tensor-parallel-size",
    "2",
    "--dtype",
    "float32",
    "--max-model-len",
    "128",
    "--num-gpu-blocks-override",
    "16",
    "--served-model-name",
    "tiny",
]
PROMPT = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12]


def _workers(server) -> list[psutil.Process]:
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    return [p for p in descendants if "infernetes.runtime.worker.worker_process" in p.cmdline()]


@pytest.fixture
def tp_server(tiny_llama_dir, server_process_factory, request):
    with server_process_factory(
        [str(tiny_llama_dir), *ARGS], log_name=f"tensor-parallel-{request.node.name}.log"
    ) as server:
        yield server


@pytest.mark.slow
def test_openai_client_gets_transformers_tokens_and_sigterm_leaves_nothing(
    tp_server, tiny_llama_dir
):
    workers = _workers(tp_server)
    assert len(workers) == 2
    client = openai.OpenAI(base_url=f"{tp_server.url}/v1", api_key="unused")
    completion = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    tokens = [int(t.removeprefix("token_id:")) for t in completion.choices[0].logprobs.tokens]
    assert tokens == hf_greedy_tokens(tiny_llama_dir, PROMPT, 8)
    everyone = psutil.Process(tp_server.process.pid).children(recursive=True)
    assert tp_server.stop(signal.SIGTERM) == 0
    assert wait_until(lambda: all(gone(p) for p in everyone)), [p.cmdline() for p in everyone]


@pytest.mark.slow
def test_a_killed_worker_fails_health_and_stops_the_server(tp_server):
    _workers(tp_server)[1].kill()
    assert wait_until(lambda: tp_server.process.poll() is not None), tp_server.tail()
    assert tp_server.process.returncode == 1
    assert "worker rank 1" in tp_server.tail()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{tp_server.url}/health", timeout=2)


@pytest.mark.slow
def test_data_parallel_serves_from_two_cores(tiny_llama_dir, server_process_factory):
    args = [a for a in ARGS if a not in ("--tensor-parallel-size", "2")]
    with server_process_factory(
        [str(tiny_llama_dir), *args, "--data-parallel-size", "2"], log_name="data-parallel.log"
    ) as server:
        cores = [
            p
            for p in psutil.Process(server.process.pid).children()
            if "spawn_main" in " ".join(p.cmdline())
        ]
        assert len(cores) == 2
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        for _ in range(4):
            completion = client.completions.create(
                model="tiny",
                prompt=PROMPT,
                max_tokens=8,
                temperature=0,
                extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
                logprobs=1,
            )
            tokens = [
                int(t.removeprefix("token_id:")) for t in completion.choices[0].logprobs.tokens
            ]
            assert tokens == hf_greedy_tokens(tiny_llama_dir, PROMPT, 8)
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'vllm:num_requests_running{engine="1",model_name="tiny"}' in metrics
        assert server.stop(signal.SIGTERM) == 0
        assert wait_until(lambda: all(gone(p) for p in cores))
