"""The engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING, the default): it serves
through the API process, leaves with it, and its death fails /health and stops the server
(unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)."""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest
from waits import gone, wait_until

ARGS = [
    "--max-model-len",
    "128",
    "--num-gpu-blocks-override",
    "16",
    "--disable-uvicorn-access-log",
    "--served-model-name",
    "tiny",
]
BODY = {"model": "tiny", "prompt": "Hello there", "max_tokens": 4, "temperature": 0}


def _core_process(server) -> psutil.Process:
    children = psutil.Process(server.process.pid).children()
    cores = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    assert len(cores) == 1, [c.cmdline() for c in children]
    return cores[0]


@pytest.fixture
def start(tiny_llama_dir, server_process_factory):
    started = []

    def run(env: dict[str, str] | None = None, log_name: str = "engine-process.log"):
        server = server_process_factory([str(tiny_llama_dir), *ARGS], env=env, log_name=log_name)
        started.append(server)
        server.wait_ready()
        return server

    yield run
    for server in started:
        server.stop()


def test_core_serves_from_its_own_process_and_leaves_with_the_server(start, maps_torch):
    server = start(log_name="engine-process-sigterm.log")
    core = _core_process(server)
    response = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 4
    assert maps_torch(core.pid) and not maps_torch(server.process.pid)
    assert server.stop(signal.SIGTERM) == 0
    assert wait_until(lambda: gone(core))


def test_core_death_fails_health_and_stops_the_server(start):
    server = start(log_name="engine-process-death.log")
    _core_process(server).kill()
    # The server notices, fails its probes and exits with an error (Kubernetes restarts it).
    assert wait_until(lambda: server.process.poll() is not None), server.tail()
    assert server.process.returncode == 1
    assert "the engine core process exited" in server.tail()


def test_core_death_with_keep_alive_answers_503(start):
    server = start(
        env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}, log_name="engine-process-keep-alive.log"
    )
    _core_process(server).kill()
    assert wait_until(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 503)
    response = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=30)
    assert response.status_code == 503
    assert "engine" in response.json()["error"]["message"]
    time.sleep(1.5)  # longer than the engine watch interval: still up
    assert server.process.poll() is None


def test_multiprocessing_off_keeps_the_core_in_the_server_process(start):
    server = start(env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, log_name="engine-thread.log")
    assert psutil.Process(server.process.pid).children() == []
    response = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60)
    assert response.json()["usage"]["completion_tokens"] == 4


def test_output_codec_round_trip_sends_the_prompt_once():
    import pickle

    from infernetes.runtime.engine.core_client import OutputCodec
    from infernetes.runtime.engine.messages import StepOutputs
    from infernetes.runtime.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput

    def output(step: int, finished: bool) -> RequestOutput:
        completions = [
            CompletionOutput(
                i,
                f"t{step}",
                [step, i],
                -0.5 * step,
                [{step: Logprob(-0.5, 1, "x")}],
                "length" if finished else None,
                None,
            )
            for i in range(2)
        ]
        return RequestOutput(
            "req",
            "a prompt",
            [5, 6, 7],
            None,
            completions,
            finished,
            RequestMetrics(1.0, 2.0 + step, 1.5, 1.7, 0.1, 3.0 if finished else None, 2),
            2,
        )

    sender, receiver = OutputCodec(), OutputCodec()
    steps = [output(0, False), output(1, False), output(2, True)]
    packed = [pickle.dumps(sender.pack_message(StepOutputs([o], []))) for o in steps]
    assert b"a prompt" in packed[0] and b"a prompt" not in packed[1]
    received = [receiver.unpack_message(pickle.loads(p)).outputs[0] for p in packed]
    assert received == steps
    assert sender.prompts == {} and receiver.prompts == {}
