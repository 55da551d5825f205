"""``infernetes serve --distributed-executor-backend ray -tp 2`` on the CPU: the engine core
starts a local Ray and one actor per rank; the official openai client gets transformers' greedy
tokens; a killed rank stops the server; SIGTERM, or the API process killed, leaves no process
behind, Ray's own included.
(Without Ray installed the flag exits 2: test_server_engine_settings.py.)"""

from __future__ import annotations

import os
import signal

import openai
import psutil
import pytest
from infernetes.runtime.testing import hf_greedy_tokens
from waits import gone, wait_until

pytest.importorskip("ray")

ARGS = [
    "--distributed-executor-backend",
    "ray",
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


def _ray_actors(server) -> list[psutil.Process]:
    descendants = psutil.Process(server.process.pid).children(recursive=True)
    return [p for p in descendants if "RankActor" in " ".join(p.cmdline())]


def _all_end(processes: list[psutil.Process]) -> None:
    """Every one of ``processes`` (the server's, Ray's included) ends."""
    left = lambda: [p for p in processes if not gone(p)]  # noqa: E731
    assert wait_until(lambda: not left()), [p.cmdline() for p in left()]


@pytest.mark.slow  # a local Ray cluster: ten seconds and more to start
def test_ray_ranks_serve_the_openai_client_and_sigterm_leaves_nothing(
    tiny_llama_dir, server_process_factory
):
    server = server_process_factory([str(tiny_llama_dir), *ARGS], log_name="ray.log")
    try:
        server.wait_ready()
        assert wait_until(lambda: len(_ray_actors(server)) == 2), server.tail()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
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
        everyone = psutil.Process(server.process.pid).children(recursive=True)
        assert server.stop(signal.SIGTERM) == 0
        _all_end(everyone)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_killed_ray_rank_fails_the_server(tiny_llama_dir, server_process_factory):
    server = server_process_factory([str(tiny_llama_dir), *ARGS], log_name="ray-killed.log")
    try:
        server.wait_ready()
        assert wait_until(lambda: len(_ray_actors(server)) == 2), server.tail()
        everyone = psutil.Process(server.process.pid).children(recursive=True)
        _ray_actors(server)[1].kill()
        assert wait_until(lambda: server.process.poll() is not None), server.tail()
        assert server.process.returncode == 1
        assert "(a Ray actor) died" in server.tail()
        _all_end(everyone)
    finally:
        server.stop()


@pytest.mark.slow
def test_the_api_process_killed_leaves_no_ray_process(tiny_llama_dir, server_process_factory):
    server = server_process_factory([str(tiny_llama_dir), *ARGS], log_name="ray-api-killed.log")
    try:
        server.wait_ready()
        assert wait_until(lambda: len(_ray_actors(server)) == 2), server.tail()
        everyone = psutil.Process(server.process.pid).children(recursive=True)
        os.kill(server.process.pid, signal.SIGKILL)
        _all_end(everyone)
    finally:
        server.stop()
